//! The lock contract: the [`Locker`] trait every backend and wrapper
//! implements, the types in its signatures ([`MarkAdvance`],
//! [`RefreshRequest`]) and [`try_lock_in_turn`], the default multi-key
//! attempt a backend may fall back to. Re-exported at the crate root
//! (`distlock::Locker`).

use std::any::Any;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    inspect, validate, wait, Capabilities, Error, Lease, ReleaseWatch, Result, WaitPolicy,
};

/// What [`Locker::advance_mark`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkAdvance {
    /// The mark was absent (`previous: None`) or lower than the value, and
    /// now equals it. Exactly one of any number of concurrent callers
    /// advancing one mark to one value gets this answer.
    Advanced {
        /// The mark before this call.
        previous: Option<i64>,
    },
    /// The mark already was at or past the value, and is unchanged.
    AlreadyAt {
        /// The mark as stored.
        current: i64,
    },
}

impl MarkAdvance {
    /// True if this call moved the mark.
    pub fn advanced(self) -> bool {
        matches!(self, Self::Advanced { .. })
    }
}

/// The backend-neutral lock contract.
///
/// Object-safe: use it as `Arc<dyn Locker>` (what [`connect`](crate::connect) returns).
/// Every method validates its input ([`validate`](crate::validate)): an empty or oversized key,
/// or a zero ttl, is [`Error::InvalidInput`]. An outage is never reported as
/// contention: `Ok(None)`, [`Error::NotAcquired`] and [`Error::Timeout`] mean
/// the backend answered that somebody else holds the lock.
///
/// # Implementing a backend
///
/// - **Provide** [`backend`](Locker::backend),
///   [`capabilities`](Locker::capabilities), [`try_lock`](Locker::try_lock)
///   and [`unlock`](Locker::unlock). Build each grant with [`Lease::new`]
///   from [`LeaseParts`](crate::LeaseParts) (a fresh [`new_owner_token`](crate::new_owner_token), the fencing token, a
///   `valid_until` measured from *before* the request was sent), and keep
///   its [`Lease::lost_notifier`] if the backend can learn that a lock is
///   gone (a dead connection).
/// - **The defaults**: [`lock`](Locker::lock) is the shared waiting loop
///   (backoff with jitter, woken by [`watch_releases`](Locker::watch_releases)
///   where it yields, bounded by `timeout` + [`DEADLINE_GRACE`](crate::DEADLINE_GRACE)); override it
///   only for a server-side wait, and keep that bound
///   (`deadline::bounded` inside the crate). [`refresh`](Locker::refresh),
///   [`forget`](Locker::forget), [`try_lock_shared`](Locker::try_lock_shared):
///   `Unsupported` (a backend without shared locks overrides it only to give
///   its own reason). [`lock_shared`](Locker::lock_shared): the same waiting
///   loop over `try_lock_shared`. `watch_releases`: none.
///   [`backend_key`](Locker::backend_key): the key itself.
/// - **Cancel safety**: `try_lock` must be safe to drop at any await point
///   (the waiting loop and callers' timeouts drop it): an attempt that may
///   have reached the server is undone by its owner token, as the Redis and
///   Postgres backends do with drop guards.
/// - **Wrappers** (a `Locker` around a `Locker`, such as [`PrefixLocker`](crate::PrefixLocker))
///   forward every method explicitly (put
///   `#[deny(clippy::missing_trait_methods)]` on the impl) and re-home the
///   leases they hand out with [`Lease::rebind`], so release, refresh and the
///   keepalive pass through them too; a wrapper that rewrites keys also
///   calls [`Lease::rename`] and maps keys in `unlock` and `refresh`.
/// - **Conformance**: run [`conformance_suite!`](crate::conformance_suite!) (feature `testkit`)
///   against a real server; every check asserts the behaviour your
///   [`Capabilities`] declare.
#[async_trait]
pub trait Locker: Any + Send + Sync + fmt::Debug {
    /// The backend's name (`"memory"`, `"file"`, `"redis"`, ...), used in
    /// errors, metrics and spans.
    fn backend(&self) -> &'static str;

    /// What this backend supports beyond the core contract.
    fn capabilities(&self) -> Capabilities;

    /// The name under which `key` is stored in the backend (after any prefix
    /// or hash tag), for logs and spans. Defaults to `key` itself.
    fn backend_key(&self, key: &str) -> String {
        key.to_owned()
    }

    /// One non-blocking attempt to take `key` for `ttl`.
    ///
    /// `Ok(Some(lease))`: acquired. `Ok(None)`: held elsewhere (contention).
    /// What `ttl` means depends on the backend (see [`Capabilities::expires`]
    /// and each backend's docs).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key or ttl; [`Error::Backend`] or
    /// [`Error::DeadlineExceeded`] when the backend failed or did not answer
    /// within its own bound (the caller cannot tell whether the lock is free;
    /// [`Error::is_outcome_unknown`] says whether this attempt may have taken
    /// it, in which case it is being undone); [`Error::Unavailable`] through
    /// an open [`BreakerLocker`](crate::BreakerLocker).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped attempt that may have taken the lock is undone
    /// in the background by its owner token, so no lock is left held for a
    /// caller that is gone.
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>>;

    /// Waits up to `timeout` to take `key` for `ttl`.
    ///
    /// A zero `timeout` makes exactly one attempt and reports contention as
    /// [`Error::NotAcquired`]; otherwise a lock still held at the deadline is
    /// [`Error::Timeout`]. A `timeout` too long to represent waits for ever.
    ///
    /// The call returns within `timeout` + [`DEADLINE_GRACE`](crate::DEADLINE_GRACE) whatever the
    /// backend does: an attempt still unanswered then is abandoned (and
    /// undone in the background, since it may have succeeded on the server)
    /// and reported as [`Error::DeadlineExceeded`], an outage, never as
    /// contention.
    ///
    /// The default waits with [`WaitPolicy::default`] (see [`WaitLocker`](crate::WaitLocker) to
    /// change it); backends with a server-side wait override it, keeping the
    /// same bound.
    ///
    /// # Errors
    ///
    /// [`Error::NotAcquired`] (zero timeout) or [`Error::Timeout`] when the
    /// lock stayed held; [`Error::DeadlineExceeded`] or [`Error::Backend`] on
    /// an outage; [`Error::InvalidInput`] for a bad key or ttl.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future ends the wait, and an attempt in
    /// flight is undone as for [`try_lock`](Locker::try_lock) (a Postgres
    /// server-side wait is cancelled on the server). Nothing is granted to a
    /// waiter that is gone.
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        wait::acquire(self, key, ttl, timeout, &WaitPolicy::default()).await
    }

    /// One non-blocking attempt at each of `keys`, in the order given: the
    /// lease of the first one that was free, `None` if every one was held.
    /// At most one key is taken; each is an ordinary exclusive lock (the
    /// same lock [`try_lock`](Locker::try_lock) takes), so callers that try
    /// the keys one at a time and callers that use this exclude each other.
    ///
    /// This is a [`Semaphore`](crate::semaphore::Semaphore)'s attempt over its
    /// permit keys. The default ([`try_lock_in_turn`]) tries the keys one at
    /// a time, so it costs up to one round trip per key; backends that can
    /// try them in fewer requests override it, and a full semaphore then
    /// costs one or two round trips instead of N.
    ///
    /// | backend | one attempt over N keys |
    /// | --- | --- |
    /// | Redis (standalone, Sentinel) | **one script** over all the keys, one round trip at any occupancy (see the `redis` module docs) |
    /// | Postgres | the first key as `try_lock` tries it, then, if it is held, **one statement** over the rest: at most two round trips at any occupancy; callers of one locker in that statement over the same keys wait for each other's answers (see the `postgres` module docs) |
    /// | MySQL/MariaDB | the default: one `try_lock` per key (its docs say why no single statement is sound there) |
    /// | every other backend (Redis Cluster, Redlock included) | the default |
    ///
    /// Wrappers ([`WaitLocker`](crate::WaitLocker), [`PrefixLocker`](crate::PrefixLocker), the metrics, tracing and
    /// circuit-breaker wrappers) forward it, so the backend's path is kept.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for no keys, more than
    /// [`validate::MAX_KEYS_PER_ATTEMPT`], a bad key or ttl; otherwise as
    /// [`try_lock`](Locker::try_lock): an error ends the attempt at the key
    /// it happened on.
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Locker::try_lock): a key taken by an attempt that is
    /// dropped is released in the background by its owner token.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::{memory::MemoryLocker, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let locker = MemoryLocker::new();
    /// let ttl = Duration::from_secs(30);
    /// let slots = ["slot#0".to_owned(), "slot#1".to_owned()];
    /// let held = locker.try_lock("slot#0", ttl).await?.unwrap();
    /// let lease = locker.try_lock_any(&slots, ttl).await?.unwrap();
    /// assert_eq!(lease.key(), "slot#1");
    /// assert!(locker.try_lock_any(&slots, ttl).await?.is_none());
    /// # drop((held, lease));
    /// # Ok(())
    /// # }
    /// ```
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        try_lock_in_turn(self, keys, ttl).await
    }

    /// One non-blocking attempt to take a **shared** (reader) lease on `key`
    /// for `ttl`.
    ///
    /// Shared holders coexist; an exclusive lock ([`try_lock`](Locker::try_lock),
    /// [`lock`](Locker::lock)) excludes them and they exclude it. `Ok(None)`:
    /// an exclusive holder has the key (contention). The lease is a [`Lease`](crate::Lease)
    /// like any other: owner token, release (also by
    /// [`unlock`](Locker::unlock) with its owner token), drop-safety,
    /// [`refresh`](Locker::refresh) and keepalive where the backend has them,
    /// and the lost signal.
    ///
    /// **Fencing token**: the token of the key's latest exclusive grant, not
    /// advanced (0 if the key was never locked exclusively; memory's counter
    /// is shared by every key, so there it is that counter; etcd's is its
    /// cluster-wide revision, so there it is the oldest reader's revision,
    /// between the writers' as its docs show; ZooKeeper's is the ensemble's
    /// zxid, so there it is the oldest reader's node's czxid, likewise). Shared holders
    /// do not exclude each other, so nothing among them needs ordering; what
    /// a resource needs is their order against writers, and that holds: a
    /// shared lease's token is at least every earlier writer's and less than
    /// every later writer's, so a resource that has seen writer `N + 1` can
    /// reject a reader still presenting `N`. Tokens thus strictly increase
    /// over exclusive grants and never decrease over all grants. (Advancing
    /// the counter per reader would also make readers write the shared
    /// state they only read: on the file backend, concurrent readers would
    /// clobber one record.)
    ///
    /// **A waiting writer and new readers**: as
    /// [`Capabilities::writer_priority`] says.
    ///
    /// - Where it is false (memory, file, Redis), a waiting writer does not block
    ///   new readers: it polls (or is woken) and gets the key only when no
    ///   reader holds it, so a steady overlap of readers can starve it.
    /// - Where it is true (Postgres, etcd, ZooKeeper), the server queues a writer waiting in
    ///   [`lock`](Locker::lock), and readers that come after it, from any
    ///   client, are contention here and wait behind it in
    ///   [`lock_shared`](Locker::lock_shared), until it has had the key:
    ///   readers cannot starve a writer. The price, as for a
    ///   writer-preferring `RwLock`: a reader that asks for the key again
    ///   while it holds it (the same task, or one it waits for) can wait for
    ///   a writer that waits for it. Do not nest readers of one key.
    ///
    /// Each backend's docs say which; the conformance suite checks it.
    ///
    /// The default is [`Error::Unsupported`] ([`Capabilities::shared`]
    /// false); backends without a reader mode say why.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Locker::try_lock); [`Error::Unsupported`] where the
    /// backend has no shared locks.
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Locker::try_lock): a dropped attempt leaves no lock
    /// held for a caller that is gone.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::{memory::MemoryLocker, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let locker = MemoryLocker::new();
    /// let ttl = Duration::from_secs(30);
    /// let a = locker.try_lock_shared("catalog", ttl).await?.unwrap();
    /// let b = locker.try_lock_shared("catalog", ttl).await?.unwrap();
    /// // Readers beside readers; a writer is contention until both are gone.
    /// assert!(locker.try_lock("catalog", ttl).await?.is_none());
    /// a.release().await?;
    /// b.release().await?;
    /// assert!(locker.try_lock("catalog", ttl).await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let _ = (key, ttl);
        Err(Error::unsupported(
            self.backend(),
            "try_lock_shared",
            "this backend has no shared locks",
        ))
    }

    /// Waits up to `timeout` to take a shared (reader) lease on `key` for
    /// `ttl`: [`try_lock_shared`](Locker::try_lock_shared) as
    /// [`lock`](Locker::lock) is to [`try_lock`](Locker::try_lock), with the
    /// same zero-timeout rule and the same bound (`timeout` +
    /// [`DEADLINE_GRACE`](crate::DEADLINE_GRACE)).
    ///
    /// The default is the shared waiting loop over
    /// [`try_lock_shared`](Locker::try_lock_shared), woken by
    /// [`watch_releases`](Locker::watch_releases): a backend that implements
    /// `try_lock_shared` gets a correct wait for free, as it does for
    /// `lock`; on a backend without shared locks the first attempt's
    /// [`Error::Unsupported`] is the answer, at once.
    ///
    /// # Errors
    ///
    /// As [`lock`](Locker::lock); [`Error::Unsupported`] where the backend
    /// has no shared locks.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Locker::lock): dropping the future ends the wait, and
    /// nothing is granted to a waiter that is gone.
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        wait::acquire_as(self, key, ttl, timeout, &WaitPolicy::default(), true).await
    }

    /// Releases `key` if `owner` holds it; otherwise [`Error::NotHeld`] and
    /// nothing changes.
    ///
    /// Works without the [`Lease`](crate::Lease) value (for example from another process
    /// handed the owner token) where [`Capabilities::unlock_by_owner`] says so;
    /// elsewhere releasing a lock held by another instance is
    /// [`Error::Unsupported`]. Prefer [`Lease::release`], which also tells the
    /// lease's watchers first.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `owner` does not hold it (expired, taken over,
    /// already released: nothing was deleted); [`Error::Unsupported`] as
    /// above; [`Error::Backend`] or [`Error::DeadlineExceeded`] if the backend
    /// failed (the lock is then freed by its safety net: ttl expiry or the
    /// end of the holding session).
    ///
    /// # Cancel safety
    ///
    /// A dropped unlock may or may not have released the lock; releasing by
    /// owner token again is always safe (nobody else has the token).
    async fn unlock(&self, key: &str, owner: &str) -> Result<()>;

    /// Extends `key` to `ttl` from now if `owner` holds it; otherwise
    /// [`Error::NotHeld`] and nothing changes. Where locks do not expire it
    /// confirms the lock is still held.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `owner` no longer holds it: stop the guarded
    /// work, somebody else may have the lock. [`Error::Unsupported`] where
    /// [`Capabilities::refresh`] is false (the default). [`Error::Backend`] or
    /// [`Error::DeadlineExceeded`] if the backend failed: the lock keeps the
    /// validity it had, and a retry before it lapses may succeed.
    ///
    /// # Cancel safety
    ///
    /// A dropped refresh may or may not have extended the lock; the lease
    /// keeps its earlier, shorter validity, which is the safe side.
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        let _ = (key, owner, ttl);
        Err(Error::unsupported(
            self.backend(),
            "refresh",
            "this backend has no refresh",
        ))
    }

    /// Refreshes several leases of this locker at once, as
    /// [`refresh`](Locker::refresh) would each of them: one result per
    /// request, in order. The keepalive scheduler calls it with the
    /// refreshes that fall due together, so a backend that can check and
    /// extend many locks in one round trip (a multi-key script on Redis, one
    /// statement per session on Postgres) keeps the keepalive traffic of many
    /// held leases to a few round trips.
    ///
    /// The default refreshes them through [`refresh`](Locker::refresh), 64
    /// at a time. Wrappers forward it to the locker they
    /// wrap, doing for each request what their `refresh` does.
    ///
    /// # Errors
    ///
    /// Each result is what [`refresh`](Locker::refresh) would return for its
    /// request. A failure of the whole batch (the connection broke) is that
    /// error in every result.
    ///
    /// # Cancel safety
    ///
    /// As for [`refresh`](Locker::refresh): a dropped batch may or may not
    /// have extended each lock; the leases keep their earlier validity.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        // A bounded number at a time: a batch of leases whose locks do not
        // expire can be large.
        let mut results = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(64) {
            let refreshed = futures_util::future::join_all(
                chunk
                    .iter()
                    .map(|request| self.refresh(request.key, request.owner, request.ttl)),
            )
            .await;
            results.extend(refreshed);
        }
        results
    }

    /// Deletes what the backend keeps for `key` beyond a held lock (its
    /// fencing counter, its lock file, its fencing row), if nobody holds
    /// `key`. [`Error::Unsupported`] by default, for backends that keep
    /// nothing or cannot delete it safely.
    ///
    /// **Fencing tokens of a forgotten key start again from 1.** A resource
    /// that still remembers a token of the key's earlier grants would then
    /// reject every new holder, or worse, a stale holder from before the
    /// forget could present a token a new holder also gets. Forget only keys
    /// that nobody relying on fencing will ever lock again: benchmark and
    /// test keys, decommissioned jobs. Backends whose fencing counter is not
    /// per key ([`memory`](crate::memory): one counter for every key) keep handing out
    /// increasing tokens; that is still safe.
    ///
    /// # Errors
    ///
    /// - [`Error::NotAcquired`] if `key` is held (by this locker, another
    ///   client, or an attempt in flight): nothing is deleted and the
    ///   holder's lock is untouched.
    /// - [`Error::Unsupported`] where the backend has no forget.
    /// - [`Error::InvalidInput`] for an unusable key; [`Error::Backend`] or
    ///   [`Error::DeadlineExceeded`] if the backend failed or did not answer
    ///   in time (bounded like the backend's other calls), in which case
    ///   the state may have been deleted or not.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is safe: each backend forgets in one atomic step
    /// (one script, one statement, one `unlink` under the lock), so the key
    /// is either forgotten or left as it was, never half deleted, and no
    /// lock is left held for it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::{memory::MemoryLocker, Error, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let locker = MemoryLocker::new();
    /// let lease = locker.try_lock("bench-1", Duration::from_secs(5)).await?.unwrap();
    /// // Held: refused, and the lock stays held.
    /// assert!(matches!(locker.forget("bench-1").await, Err(Error::NotAcquired { .. })));
    /// lease.release().await?;
    /// // Free: forgotten.
    /// locker.forget("bench-1").await?;
    /// # Ok(())
    /// # }
    /// ```
    async fn forget(&self, key: &str) -> Result<()> {
        let _ = key;
        Err(Error::unsupported(
            self.backend(),
            "forget",
            "this backend cannot forget a key",
        ))
    }

    /// Raises the durable high-water mark `name` to `value` if the stored
    /// mark is lower or absent, in one atomic step on the backend, and says
    /// which happened.
    ///
    /// A mark only ever grows, and concurrent calls with one value are
    /// serialized: exactly one of them gets [`MarkAdvance::Advanced`]. The
    /// cron scheduler marks each job with the last tick it started, so a
    /// replica whose clock lags (by any amount) finds a tick already run
    /// and skips it. Marks live beside the locks, in their own namespace
    /// (a mark and a lock may share a name), and are not touched by
    /// [`forget`](Locker::forget). [`Error::Unsupported`] by default, for
    /// backends that cannot store one ([`Capabilities::marks`] false).
    ///
    /// The mark is unrelated to any lock: holding a lock while advancing it
    /// is the caller's business (the scheduler holds the tick's claim).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for an unusable name (the rules of
    ///   [`validate::key`]).
    /// - [`Error::Unsupported`] where [`Capabilities::marks`] is false.
    /// - [`Error::Backend`] or [`Error::DeadlineExceeded`] if the backend
    ///   failed or did not answer within its bound: the mark may have been
    ///   advanced or not ([`Error::is_outcome_unknown`]). Treat that as "the
    ///   tick may have been taken": never as permission to run it.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have advanced the mark; it never leaves
    /// it half written or lowered.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock::{memory::MemoryLocker, Locker, MarkAdvance};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let locker = MemoryLocker::new();
    /// let first = locker.advance_mark("cron:report", 1_700_000_000_000).await?;
    /// assert_eq!(first, MarkAdvance::Advanced { previous: None });
    /// // A lagging replica tries the same tick again: refused.
    /// let again = locker.advance_mark("cron:report", 1_700_000_000_000).await?;
    /// assert_eq!(again, MarkAdvance::AlreadyAt { current: 1_700_000_000_000 });
    /// # Ok(())
    /// # }
    /// ```
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        let _ = (name, value);
        Err(Error::unsupported(
            self.backend(),
            "advance_mark",
            "this backend cannot store marks",
        ))
    }

    /// What the backend found, when it was built, that makes its marks
    /// ([`advance_mark`](Locker::advance_mark)) and fencing tokens less
    /// durable than they look: a server that does not persist them (Redis
    /// with `appendonly no`: a restart forgets which cron ticks ran and
    /// restarts tokens at 1), replicas a failover could promote without the
    /// last writes, or settings it could not read. One sentence per finding,
    /// naming the setting, the consequence and the fix. Empty when it found
    /// nothing, or has nothing to check (the default).
    ///
    /// Read once at build time and never refreshed; no I/O here. A
    /// scheduler's owner should show these when it starts (`distlock cron`
    /// prints them once on stderr).
    ///
    /// ```
    /// use distlock::{memory::MemoryLocker, Locker};
    ///
    /// assert!(MemoryLocker::new().durability_warnings().is_empty());
    /// ```
    fn durability_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// Who holds `key` now: `Ok(None)` if nobody does, else what the backend
    /// knows of the holder ([`inspect::HeldLock`]). Never takes, waits for or
    /// changes the lock. A lock held by a client that recorded nothing (a
    /// peer library, `etcdctl lock`) is held by an unknown holder
    /// (`holder: None`), never free.
    ///
    /// The answer is a snapshot: the lock may change hands right after.
    /// [`Error::Unsupported`] by default ([`Capabilities::inspect`] false).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Unsupported`] as
    /// above; [`Error::Backend`] or [`Error::DeadlineExceeded`] if the
    /// backend failed or did not answer within its bound: then nothing is
    /// known, and the lock is not reported free.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::{memory::MemoryLocker, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let locker = MemoryLocker::new();
    /// assert!(locker.inspect("report").await?.is_none());
    /// let lease = locker.try_lock("report", Duration::from_secs(30)).await?.unwrap();
    /// let held = locker.inspect("report").await?.expect("held");
    /// assert_eq!(held.holder.unwrap().pid, std::process::id());
    /// assert!(held.ttl_left.unwrap() <= Duration::from_secs(30));
    /// # drop(lease);
    /// # Ok(())
    /// # }
    /// ```
    async fn inspect(&self, key: &str) -> Result<Option<inspect::HeldLock>> {
        let _ = key;
        Err(Error::unsupported(
            self.backend(),
            "inspect",
            "this backend cannot tell who holds a lock",
        ))
    }

    /// The locks held now whose keys start with `prefix` (every held lock
    /// for `""`), sorted by key, each as [`inspect`](Locker::inspect) would
    /// report it. [`Error::Unsupported`] by default, and where the backend
    /// cannot enumerate its locks ([`Capabilities::list`] false).
    ///
    /// A snapshot, not an atomic one on every backend: a lock taken or
    /// released while the listing runs may or may not be in it.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] as above; [`Error::Backend`] or
    /// [`Error::DeadlineExceeded`] if the backend failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    async fn list(&self, prefix: &str) -> Result<Vec<inspect::HeldLock>> {
        let _ = prefix;
        Err(Error::unsupported(
            self.backend(),
            "list",
            "this backend cannot enumerate its locks",
        ))
    }

    /// Frees `key` whoever holds it, the way `how` says, and returns the
    /// holder it evicted (`Ok(None)`: nobody held it, nothing was done).
    /// For operators (`distlock release --force`), never for the guarded
    /// work itself: the evicted holder may still be working.
    ///
    /// The evicted holder learns of it at its next refresh (`NotHeld`, its
    /// lost signal fires; within ttl/3 under a keepalive) or, with
    /// [`inspect::ForceRelease::TerminateSession`], when its connection
    /// dies. Its fencing token makes its late writes rejectable. Every
    /// forced release is logged at `warn` with who forced it and whom it
    /// evicted. [`Error::Unsupported`] by default, and for a `how` the
    /// backend cannot do (its docs say which it can; the reason says what to
    /// do instead).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Unsupported`] as
    /// above; [`Error::Backend`] or [`Error::DeadlineExceeded`] if the
    /// backend failed: the lock may or may not have been freed (inspect it).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have freed the lock.
    async fn force_release(
        &self,
        key: &str,
        how: inspect::ForceRelease,
    ) -> Result<Option<inspect::HeldLock>> {
        let _ = (key, how);
        Err(Error::unsupported(
            self.backend(),
            "force_release",
            "this backend cannot free a lock it does not own",
        ))
    }

    /// Native wake-up hook for waiting: a subscription that yields when `key`
    /// may have been released. [`lock`](Locker::lock) subscribes *before* each
    /// round of attempts so a release in between is never missed. `Ok(None)`
    /// (the default) means the backend cannot notify and waiters poll.
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        let _ = key;
        Ok(None)
    }
}

impl dyn Locker {
    /// The concrete locker behind a `dyn Locker`, if it is a `T`: the way
    /// to a backend's own powers (`RedisLocker::remaining_ttl`,
    /// `PostgresLocker::try_lock_raw` on an application's own advisory
    /// keys) from the
    /// `Arc<dyn Locker>` that [`connect`](crate::connect) returns, as
    /// `dyn Error::downcast_ref` reaches a concrete error. `None` for any
    /// other type, including a wrapper around a `T` (take the wrapper, then
    /// its `get_ref()`).
    ///
    /// ```
    /// use distlock::memory::MemoryLocker;
    /// use distlock::file::FileLocker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let locker = distlock::connect("memory://").await?;
    /// let memory: &MemoryLocker = locker.downcast_ref().expect("a memory:// URL");
    /// # let _ = memory;
    /// assert!(locker.downcast_ref::<FileLocker>().is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn downcast_ref<T: Locker>(&self) -> Option<&T> {
        (self as &dyn Any).downcast_ref()
    }

    /// True if the locker behind this `dyn Locker` is a `T` (see
    /// `downcast_ref` above).
    pub fn is<T: Locker>(&self) -> bool {
        (self as &dyn Any).is::<T>()
    }
}

/// The default [`Locker::try_lock_any`]: [`try_lock`](Locker::try_lock)
/// on each of `keys` in order until one is granted, one round trip per key
/// tried. Public so that a backend (or a wrapper) can fall back to it where
/// one request cannot cover the keys (a Redis Cluster spreads them over
/// slots), and so that a benchmark can set it beside a native override.
///
/// # Errors
///
/// [`Error::InvalidInput`] for no keys, more than
/// [`validate::MAX_KEYS_PER_ATTEMPT`] or a bad key; otherwise the first
/// error of a `try_lock`, which ends the attempt at that key (keys before
/// it were held, none was taken).
///
/// # Cancel safety
///
/// As [`Locker::try_lock`]: only the `try_lock` in flight can have taken a
/// key, and it undoes itself when dropped.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use distlock::{memory::MemoryLocker, Locker};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let locker = MemoryLocker::new();
/// let slots = ["slot#0".to_owned(), "slot#1".to_owned()];
/// let ttl = Duration::from_secs(30);
/// let held = locker.try_lock("slot#0", ttl).await?.unwrap();
/// let lease = distlock::try_lock_in_turn(&locker, &slots, ttl).await?.unwrap();
/// assert_eq!(lease.key(), "slot#1");
/// # drop((held, lease));
/// # Ok(())
/// # }
/// ```
pub async fn try_lock_in_turn<L: Locker + ?Sized>(
    locker: &L,
    keys: &[String],
    ttl: Duration,
) -> Result<Option<Lease>> {
    validate::keys(keys)?;
    for key in keys {
        if let Some(lease) = locker.try_lock(key, ttl).await? {
            return Ok(Some(lease));
        }
    }
    Ok(None)
}

/// One lease to refresh in a [`Locker::refresh_many`] batch: the arguments
/// [`Locker::refresh`] takes. Its `Debug` never prints the owner token.
#[derive(Clone, Copy)]
pub struct RefreshRequest<'a> {
    /// The key as the caller of this locker names it.
    pub key: &'a str,
    /// The owner token (a credential: never logged).
    pub owner: &'a str,
    /// The new ttl, counted from when the backend applies it.
    pub ttl: Duration,
}

impl fmt::Debug for RefreshRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefreshRequest")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}
