//! What a backend can do beyond the core contract ([`Capabilities`]),
//! declared by each [`Locker`](crate::Locker) and checked by the
//! conformance suite. Re-exported at the crate root.

/// What a backend can do beyond the core contract, so callers and the
/// conformance suite can discover it without downcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// The backend frees a lock whose ttl ran out without a refresh, even if
    /// the holder is alive. False for backends that hold a lock for as long as
    /// the holder's process or connection lives (file, Postgres).
    pub expires: bool,
    /// [`Locker::refresh`](crate::Locker::refresh) is supported: it extends the ttl where locks expire
    /// and verifies the lock is still held where they do not.
    pub refresh: bool,
    /// [`Locker::unlock`](crate::Locker::unlock) works from any process or instance that knows the
    /// owner token, not only from the instance that acquired the lock.
    pub unlock_by_owner: bool,
    /// [`Locker::lock`](crate::Locker::lock) wakes a waiter when the lock is released (native
    /// wake-up: a server-side wait, or release notifications), instead of
    /// only polling.
    pub release_wakeup: bool,
    /// [`Locker::watch_releases`](crate::Locker::watch_releases) yields a notification for every release
    /// made by any client, so the shared waiting loop (the default
    /// [`Locker::lock`](crate::Locker::lock), [`WaitLocker`](crate::WaitLocker)) wakes on releases. False where only a
    /// server-side wait wakes waiters (Postgres), so a [`WaitLocker`](crate::WaitLocker) wrapper,
    /// which replaces that wait with polling, has no wake-up.
    pub release_notifications: bool,
    /// Leases carry fencing tokens.
    pub fencing: bool,
    /// [`Locker::advance_mark`](crate::Locker::advance_mark) is supported: the backend stores durable
    /// high-water marks (in-process for [`memory`](crate::memory)), which the cron
    /// scheduler uses so that no replica re-runs a finished tick.
    pub marks: bool,
    /// [`Locker::inspect`](crate::Locker::inspect) says whether a key is held and what the backend
    /// knows of its holder ([`inspect::HeldLock`](crate::inspect::HeldLock)); grants record their
    /// [`inspect::Holder`](crate::inspect::Holder) unless the backend's holder recording is turned
    /// off (then the holder is reported unknown, the lock still held).
    pub inspect: bool,
    /// [`Locker::list`](crate::Locker::list) enumerates the held locks under a prefix.
    pub list: bool,
    /// [`Locker::force_release`](crate::Locker::force_release) can free a lock whatever its owner, in at
    /// least one [`inspect::ForceRelease`](crate::inspect::ForceRelease) way (the backend's docs say which).
    pub force_release: bool,
    /// [`Locker::try_lock_shared`](crate::Locker::try_lock_shared) and [`Locker::lock_shared`](crate::Locker::lock_shared) grant shared
    /// (reader) leases: shared holders coexist, an exclusive lock excludes
    /// them and they exclude it. Where false, both are
    /// [`Error::Unsupported`](crate::Error::Unsupported) with the reason.
    pub shared: bool,
    /// With [`shared`](Self::shared): a writer waiting in [`Locker::lock`](crate::Locker::lock)
    /// is queued ahead of the readers that come after it. While it waits,
    /// [`Locker::try_lock_shared`](crate::Locker::try_lock_shared) is contention and [`Locker::lock_shared`](crate::Locker::lock_shared)
    /// waits behind it, whichever client asks, so overlapping readers
    /// cannot starve it (Postgres: the server queues the wait, not while
    /// every waiter connection is in use and the writer polls; etcd:
    /// readers and writers queue in revision order; ZooKeeper: in sequence
    /// order). False where
    /// a waiting writer gets the key only once no reader holds it, new
    /// readers coming in meanwhile (memory, file, and any locker whose
    /// `lock` is the polling loop of a [`WaitLocker`](crate::WaitLocker)). Meaningless without
    /// `shared`.
    pub writer_priority: bool,
}

impl Capabilities {
    /// Every capability. A backend declares what it lacks against it
    /// (`Capabilities { expires: false, ..Capabilities::ALL }`), so a
    /// declaration reads as the list of its exceptions.
    ///
    /// ```
    /// use distlock::Capabilities;
    ///
    /// let session_lock = Capabilities { expires: false, ..Capabilities::ALL };
    /// assert!(session_lock.fencing && !session_lock.expires);
    /// ```
    pub const ALL: Capabilities = Capabilities {
        expires: true,
        refresh: true,
        unlock_by_owner: true,
        release_wakeup: true,
        release_notifications: true,
        fencing: true,
        marks: true,
        inspect: true,
        list: true,
        force_release: true,
        shared: true,
        writer_priority: true,
    };

    /// A lock queue on a consensus store, held by a session the client keeps
    /// alive (etcd, ZooKeeper): everything but expiry (a lock lasts as long
    /// as its session) and release notifications (a waiter is woken by a
    /// watch on the contender just ahead, not by a stream of every release).
    #[cfg(any(feature = "etcd", feature = "zookeeper"))]
    pub(crate) const SESSION_QUEUE: Capabilities = Capabilities {
        expires: false,
        release_notifications: false,
        ..Capabilities::ALL
    };
}
