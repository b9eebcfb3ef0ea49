//! What a SQL backend says differently (its [`Dialect`]), and the one
//! [`Locker`] implementation every SQL backend shares over it.
//!
//! A dialect (a backend's locker state) sends the statements: one attempt,
//! a native wait, a release, "who holds this lock?", "does this session
//! still hold it (or which of these)?", forget, mark, inspect, list, force
//! release. How a statement is sent, bounded and read is the dialect's;
//! what an answer means for the caller and for the registry is decided
//! here and in [`Core`], once. How a caller's keys name the dialect's locks
//! is a [`SqlKeys`] view; every view is a [`Locker`].

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::core::{Core, Tried, WaitOn};
use super::pool::{Connector, SlotKey};
use crate::inspect::{ForceRelease, HeldLock};
use crate::session_registry::{Busy, Claim, Hold};
use crate::{
    validate, Capabilities, Error, Lease, Locker, LostReason, MarkAdvance, RefreshRequest, Result,
    SharedLocker,
};

/// A lock as a dialect handles it: the server's identity of it, and the
/// key the caller named it by (for errors, records and the lease).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lock<'a, Id> {
    /// What the server locks (an advisory key, a lock name).
    pub(crate) id: Id,
    /// The caller's key.
    pub(crate) key: &'a str,
}

/// The session type of dialect `D`.
pub(crate) type SessionOf<D> = <<D as Dialect>::Connect as Connector>::Session;

/// Builds, when asked, the context of an error ("release \"k\" on db:5432").
pub(crate) type Context<'a> = &'a (dyn Fn() -> String + Send + Sync);

/// Says whether a listed lock, recorded under a key, is one this locker
/// would take for that key (its namespace, its kind of key).
pub(crate) type Ours<'a, Id> = &'a (dyn Fn(&str, &Id) -> bool + Send + Sync);

/// A server's answer to "who holds this lock?": the holding session
/// described ("server process 42") with how to end it
/// (`pg_terminate_backend(42)`), `None` if nobody holds it; and whether the
/// holder's fencing row names the asking owner (`None` without a fencing
/// table).
pub(crate) type HolderAnswer = (Option<(String, String)>, Option<bool>);

/// Where one statement about a lock runs: the session, the server's
/// identity of the lock, and the context of its errors (a release, "who
/// holds it?", "is it still held?" all take these three alike).
pub(crate) struct On<'a, D: Dialect> {
    /// The session the statement runs on.
    pub(crate) session: &'a SessionOf<D>,
    /// The server's identity of the lock.
    pub(crate) id: &'a D::Id,
    /// Builds the context of the statement's errors.
    pub(crate) context: Context<'a>,
}

// Not derived: that would ask `D` itself to be `Copy`.
impl<D: Dialect> Clone for On<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Dialect> Copy for On<'_, D> {}

/// What a SQL backend says differently (see the [module docs](self)).
/// Every statement is bounded by the dialect's query timeout, and its
/// failure described with `context`.
pub(crate) trait Dialect: Send + Sync + Sized {
    /// How the dialect opens its sessions.
    type Connect: Connector;
    /// The server's identity of a session holding a lock (a server
    /// process id, a connection id).
    type Holder: Send;
    /// The server's identity of a lock (an advisory key, a lock name).
    type Id: Clone + Eq + Hash + fmt::Debug + Send + Sync + SlotKey + 'static;

    /// The most locks one statement of [`Locker::refresh_many`] asks
    /// about.
    const HOLDS_PER_STATEMENT: usize;

    /// Why [`Locker::try_lock_shared`] is [`Error::Unsupported`] on this
    /// dialect, or `None` where it has shared locks: it then implements
    /// [`try_once_shared`](Self::try_once_shared),
    /// [`wait_on_shared`](Self::wait_on_shared) and
    /// [`unlock_shared`](Self::unlock_shared), whose defaults refuse.
    const NO_SHARED_LOCKS: Option<&'static str>;

    /// The locker's pool, registry and shared steps.
    fn core(&self) -> &Core<Self::Connect, Self::Id>;

    /// One attempt on the lock's shared session, cancel-safe: a grant is
    /// recorded through [`Core::grant`] for `lease_locker`, and whatever
    /// an attempt abandoned took is released.
    fn try_once(
        &self,
        lock: &Lock<'_, Self::Id>,
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> impl Future<Output = Result<Tried>> + Send;

    /// [`Locker::try_lock_any`]: one attempt over `locks` (at least one),
    /// in order, taking at most one, cancel-safe as
    /// [`try_once`](Self::try_once): the lease of the first one granted,
    /// `None` if every one was held (or, for this locker, held or being
    /// tried by another of its callers).
    ///
    /// The default is [`try_once`](Self::try_once) on each lock in turn
    /// until one is granted, a round trip per lock tried, and stops at the
    /// first error (a lock still being cleaned up is one), as the trait's
    /// default does. A dialect that can try them all in one statement
    /// overrides it.
    fn try_once_any(
        &self,
        locks: &[Lock<'_, Self::Id>],
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send {
        async move {
            for lock in locks {
                let tried = self.try_once(lock, ttl, lease_locker.clone()).await?;
                if let Some(lease) = self.core().try_answer(tried, lock.key)? {
                    return Ok(Some(lease));
                }
            }
            Ok(None)
        }
    }

    /// The native wait [`Core::lock`] hands over once the first attempt
    /// found the lock held, cancel-safe (a [`WaitGuard`](super::core::WaitGuard)
    /// abandons it on the server).
    fn wait_on(
        &self,
        lock: &Lock<'_, Self::Id>,
        ttl: Duration,
        on: WaitOn<SessionOf<Self>>,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// One shared attempt, cancel-safe as [`try_once`](Self::try_once): a
    /// grant is recorded through [`Core::grant`] as shared (or joins a shared
    /// hold this locker's readers have on the key's shared session:
    /// [`Core::join`]). The default refuses
    /// ([`NO_SHARED_LOCKS`](Self::NO_SHARED_LOCKS)).
    fn try_once_shared(
        &self,
        lock: &Lock<'_, Self::Id>,
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> impl Future<Output = Result<Tried>> + Send {
        let _ = (lock, ttl, lease_locker);
        let refused = no_shared_locks(self, "try_lock_shared");
        async move { Err(refused) }
    }

    /// The native shared wait [`Core::lock`] hands over once the first
    /// shared attempt found the key held exclusively, cancel-safe as
    /// [`wait_on`](Self::wait_on). The default refuses.
    fn wait_on_shared(
        &self,
        lock: &Lock<'_, Self::Id>,
        ttl: Duration,
        on: WaitOn<SessionOf<Self>>,
    ) -> impl Future<Output = Result<Lease>> + Send {
        let _ = (lock, ttl, on);
        let refused = no_shared_locks(self, "lock_shared");
        async move { Err(refused) }
    }

    /// Releases the shared hold `on` its session (the last reader of this
    /// locker there has left): true if the session held it. The default
    /// refuses.
    fn unlock_shared(&self, on: On<'_, Self>) -> impl Future<Output = Result<bool>> + Send {
        let _ = on;
        let refused = no_shared_locks(self, "release");
        async move { Err(refused) }
    }

    /// [`Locker::forget`].
    fn forget(&self, lock: &Lock<'_, Self::Id>) -> impl Future<Output = Result<()>> + Send;

    /// [`Locker::advance_mark`].
    fn advance_mark(
        &self,
        lock: &Lock<'_, Self::Id>,
        value: i64,
    ) -> impl Future<Output = Result<MarkAdvance>> + Send;

    /// Who holds the lock, and what inspection says of the hold (`None`:
    /// free); `operation` names the caller in errors.
    fn find_hold(
        &self,
        lock: &Lock<'_, Self::Id>,
        operation: &'static str,
    ) -> impl Future<Output = Result<Option<(Self::Holder, HeldLock)>>> + Send;

    /// [`Locker::list`], keeping the locks `ours` says are this locker's.
    fn list(
        &self,
        prefix: &str,
        ours: Ours<'_, Self::Id>,
    ) -> impl Future<Output = Result<Vec<HeldLock>>> + Send;

    /// Ends the session `holder` if it still holds the lock: true if it
    /// did, false if it no longer held it (see [`Core::force_release`]).
    fn end_holder(
        &self,
        lock: &Lock<'_, Self::Id>,
        holder: Self::Holder,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Releases the lock `on` its session, which holds it: with
    /// `clear_record`, by the statement that also clears the holder record
    /// of its fencing row (the plain unlock without fencing), else by the
    /// unlock alone. True if the session held it.
    fn unlock(
        &self,
        on: On<'_, Self>,
        clear_record: bool,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Who holds the lock, asked `on` a shared session, and whether under
    /// `owner`.
    fn holder(
        &self,
        on: On<'_, Self>,
        owner: &str,
    ) -> impl Future<Output = Result<HolderAnswer>> + Send;

    /// True if the session holds the lock (and so, that it is alive).
    fn holds(&self, on: On<'_, Self>) -> impl Future<Output = Result<bool>> + Send;

    /// Whether `session` holds each of `ids`, in order: one statement (at
    /// most [`HOLDS_PER_STATEMENT`](Self::HOLDS_PER_STATEMENT) ids). The
    /// statement is made before the future is, which borrows only `self`.
    fn held_among<'s>(
        &'s self,
        session: Arc<SessionOf<Self>>,
        ids: &[&Self::Id],
    ) -> impl Future<Output = Result<Vec<bool>>> + Send + use<'s, Self>;
}

/// [`Error::Unsupported`] for `operation`, a shared-lock call on `dialect`,
/// with its reason.
fn no_shared_locks<D: Dialect>(dialect: &D, operation: &'static str) -> Error {
    Error::unsupported(
        dialect.core().backend,
        operation,
        D::NO_SHARED_LOCKS.unwrap_or("this backend has no shared locks"),
    )
}

/// A SQL locker as its callers see it: a dialect, and how their keys name
/// its locks (Postgres has two views: string keys and raw advisory keys).
/// Every such view is a [`Locker`], through the one implementation below.
pub(crate) trait SqlKeys: Clone + fmt::Debug + Send + Sync + 'static {
    /// The backend's locker state.
    type Dialect: Dialect;

    /// The locker state every view of one locker shares, and the slot of
    /// the [`Locker`] this view's leases hold (this view, shared by all of
    /// them: polling goes through its `try_lock`).
    fn parts(&self) -> (&Self::Dialect, &SharedLocker);

    /// The lock `key` names, once `key` is checked.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a key this view does not take.
    fn id(&self, key: &str) -> Result<<Self::Dialect as Dialect>::Id>;

    /// [`Locker::backend_key`]: the key itself unless the lock has a name
    /// of its own on the server.
    fn name_on_server(&self, key: &str) -> String {
        key.to_owned()
    }
}

/// What a SQL locker type shares, written once: its public constructors
/// (from a URL, its builder from a URL, from its `Config`) and
/// `held_count`, its `Debug`, and the [`SqlKeys`] view of its own keys over
/// `self.inner` (the dialect, whose `leases` its leases hold). `$builder`
/// is its builder, `$env` the prefix of its variables, `$keys` the rest of
/// its `SqlKeys` (`id`, any override). The backend adds its own `impl`,
/// with `start`.
macro_rules! sql_locker {
    ($locker:ident, $builder:ident, $env:literal, keys: { $($keys:tt)* }) => {
        impl $locker {
            /// Connects with the defaults and the URL's parameters (see the
            /// [module docs](self#url)).
            ///
            /// Opens one session now, so a wrong password, an unknown database
            /// or an unreachable server is an error here, and creates the
            /// fencing table if missing.
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a
            /// malformed URL or option (never showing the password);
            /// [`Error::Backend`](crate::Error::Backend) with the server's
            /// message, or [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded),
            /// if the server cannot be used.
            pub async fn from_url(url: &str) -> $crate::Result<Self> {
                Self::builder(url)?.build().await
            }

            #[doc = concat!("Options, starting from a URL (see [`", stringify!($builder), "`]).")]
            ///
            /// # Errors
            ///
            /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a
            /// malformed URL.
            pub fn builder(url: &str) -> $crate::Result<$builder> {
                $builder::from_url(url)
            }

            #[doc = concat!("Connects with a [`Config`] read from a URL, `", $env, "*`")]
            /// variables, JSON or YAML: the same as `config.builder()?.build()`.
            ///
            /// # Errors
            ///
            /// As [`from_url`](Self::from_url).
            ///
            /// # Cancel safety
            ///
            /// No lock is taken before it returns: dropping the future abandons
            /// the start-up (a fencing table it was creating may or may not
            /// exist afterwards).
            pub async fn from_config(config: Config) -> $crate::Result<Self> {
                config.builder()?.build().await
            }

            /// How many locks this locker (and its clones) holds right now
            /// (each shared lease counts).
            pub fn held_count(&self) -> usize {
                self.inner.core.registry.held_count()
            }
        }

        impl ::std::fmt::Debug for $locker {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let namespace = &self.inner.settings.namespace;
                self.inner.core.debug_locker(f, stringify!($locker), namespace)
            }
        }

        impl $crate::sql::dialect::SqlKeys for $locker {
            type Dialect = Inner;

            fn parts(&self) -> (&Inner, &$crate::SharedLocker) {
                (&self.inner, &self.inner.leases)
            }

            $($keys)*
        }
    };
}
pub(crate) use sql_locker;

/// The dialect of `keys`.
fn dialect<T: SqlKeys>(keys: &T) -> &T::Dialect {
    keys.parts().0
}

/// The locker `keys`' leases hold.
fn lease_locker<T: SqlKeys>(keys: &T) -> Arc<dyn Locker> {
    keys.parts().1.get_or_init(|| Arc::new(keys.clone()))
}

/// A lock of `T`'s dialect: its key, and the server's id for it.
type LockOf<'a, T> = Lock<'a, <<T as SqlKeys>::Dialect as Dialect>::Id>;

/// The lock `key` names, with the key (see [`SqlKeys::id`]).
fn lock_of<'a, T: SqlKeys>(keys: &T, key: &'a str) -> Result<LockOf<'a, T>> {
    Ok(Lock {
        id: keys.id(key)?,
        key,
    })
}

/// What every acquire checks before it reaches the server, in this order:
/// the key, the ttl, then (for `shared`, the `operation` named) that the
/// dialect has shared locks. The lock `key` names, and the dialect to ask.
fn checked_attempt<'a, T: SqlKeys>(
    keys: &'a T,
    key: &'a str,
    ttl: Duration,
    shared: Option<&'static str>,
) -> Result<(LockOf<'a, T>, &'a T::Dialect)> {
    let lock = lock_of(keys, key)?;
    validate::ttl(ttl)?;
    let dialect = dialect(keys);
    match shared {
        Some(operation) if T::Dialect::NO_SHARED_LOCKS.is_some() => {
            Err(no_shared_locks(dialect, operation))
        }
        _ => Ok((lock, dialect)),
    }
}

/// Every SQL locker, written once over its dialect: what an answer means
/// for the caller and for the registry is decided here and in `Core`.
#[async_trait]
impl<T: SqlKeys> Locker for T {
    fn backend(&self) -> &'static str {
        dialect(self).core().backend
    }

    fn capabilities(&self) -> Capabilities {
        let shared = <T::Dialect as Dialect>::NO_SHARED_LOCKS.is_none();
        Capabilities {
            shared,
            // The server queues a native wait: later readers wait behind it.
            writer_priority: shared,
            ..dialect(self).core().capabilities()
        }
    }

    fn backend_key(&self, key: &str) -> String {
        self.name_on_server(key)
    }

    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let (lock, dialect) = checked_attempt(self, key, ttl, None)?;
        let tried = dialect.try_once(&lock, ttl, lease_locker(self)).await?;
        dialect.core().try_answer(tried, key)
    }

    /// One attempt over the keys: the first key alone, as [`try_lock`]
    /// tries it, then, if it is held, the rest as the dialect makes it (one
    /// statement on Postgres, one attempt per key on MySQL; see the
    /// backends' docs). So a permit is one round trip when the first key
    /// tried is free (a semaphore's random start makes that the common case
    /// while permits are free), two at any occupancy on Postgres; and the
    /// many-key statement, whose reservations make concurrent callers of one
    /// locker wait for each other, runs only when the first key was taken.
    ///
    /// [`try_lock`]: Locker::try_lock
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        validate::keys(keys)?;
        validate::ttl(ttl)?;
        let locks = keys
            .iter()
            .map(|key| lock_of(self, key))
            .collect::<Result<Vec<_>>>()?;
        let dialect = dialect(self);
        let Some((first, rest)) = locks.split_first() else {
            return Ok(None);
        };
        let tried = dialect.try_once(first, ttl, lease_locker(self)).await?;
        match tried {
            Tried::Granted(lease) => Ok(Some(lease)),
            // A first key still being cleaned up after an abandoned attempt
            // is as unavailable as a held one while other keys remain.
            Tried::Contended | Tried::CleaningUp if !rest.is_empty() => {
                dialect.try_once_any(rest, ttl, lease_locker(self)).await
            }
            tried => dialect.core().try_answer(tried, &keys[0]),
        }
    }

    /// One shared attempt where the dialect has shared locks (see the
    /// backend's docs); [`Error::Unsupported`], with the dialect's reason,
    /// elsewhere.
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        let (lock, dialect) = checked_attempt(self, key, ttl, Some("try_lock_shared"))?;
        let tried = dialect
            .try_once_shared(&lock, ttl, lease_locker(self))
            .await?;
        dialect.core().try_answer(tried, key)
    }

    /// Waits on the server, not by polling, unless `max_waiters` waiter
    /// connections are in use, as [`lock`](Locker::lock) does (see the
    /// backend's docs); [`Error::Unsupported`] where the dialect has no
    /// shared locks.
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        let (lock, dialect) = checked_attempt(self, key, ttl, Some("lock_shared"))?;
        let try_once = |lease_locker| dialect.try_once_shared(&lock, ttl, lease_locker);
        let wait_on = |on| dialect.wait_on_shared(&lock, ttl, on);
        let (core, locker) = (dialect.core(), lease_locker(self));
        core.lock(key, ttl, timeout, true, locker, try_once, wait_on)
            .await
    }

    /// Waits on the server, not by polling, unless `max_waiters` waiter
    /// connections are in use (see the backend's docs).
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        let (lock, dialect) = checked_attempt(self, key, ttl, None)?;
        let try_once = |lease_locker| dialect.try_once(&lock, ttl, lease_locker);
        let wait_on = |on| dialect.wait_on(&lock, ttl, on);
        let (core, locker) = (dialect.core(), lease_locker(self));
        core.lock(key, ttl, timeout, false, locker, try_once, wait_on)
            .await
    }

    /// Releases the lock if `owner` holds it through this locker (a reader's
    /// shared hold too: the server's shared lock on its session is released
    /// once the last of this locker's readers there has left); otherwise
    /// says whether somebody else holds it under that owner:
    /// [`Error::Unsupported`] if another client may hold it under `owner`
    /// (only the session holding a session lock can release it),
    /// [`Error::NotHeld`] if nobody does. A lock the session no longer held
    /// (something released it by hand on the session) fires the lease's
    /// lost signal. An abandoned attempt on the key still being cleaned up
    /// is [`Error::Backend`]: the server cannot be asked until then.
    ///
    /// Cancel safety: as the statements; dropping it leaves the lock to its
    /// session.
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        let id = self.id(key)?;
        let dialect = dialect(self);
        let core = dialect.core();
        let not_held = || Error::NotHeld {
            key: key.to_owned(),
        };
        // The entry is gone before the unlock is queued, with no await in
        // between: an attempt on this key that now reserves it and reaches
        // the same session is ordered after the unlock by the server. (Or
        // just before it: the server then grants it re-entrantly, and the
        // unlock takes back one of the two holds, leaving the new one.)
        let Some((held, hold)) = core.registry.take_hold(&id, owner) else {
            return Err(match core.registry.state(&id) {
                Some(Busy::Contended) => not_held(),
                Some(Busy::CleaningUp) => core.cleanup_pending(key, "release"),
                None => {
                    let context = || format!("look up the holder of {key:?} on {}", core.target);
                    let session = core.pool.shared(&id).await?;
                    let on = On::<T::Dialect> {
                        session: &session,
                        id: &id,
                        context: &context,
                    };
                    let (holder, same_owner) = dialect.holder(on, owner).await?;
                    core.held_elsewhere(key, holder, same_owner)
                }
            });
        };
        let context = || {
            format!(
                "release {key:?} on {}; the server frees it when the session ends",
                core.target
            )
        };
        let on = On::<T::Dialect> {
            session: &held.session,
            id: &id,
            context: &context,
        };
        let released = match hold {
            // Other readers of this locker on its session still hold the
            // key through the session's one shared lock.
            Hold::Shared {
                last_on_session: false,
            } => return Ok(()),
            // Readers write no record: nothing to clear.
            Hold::Shared {
                last_on_session: true,
            } => dialect.unlock_shared(on).await?,
            // The record is cleared before the unlock in the same statement,
            // so when clearing failed (its row locked by another client past
            // the session's lock timeout) the unlock never ran, and the lock
            // would stay on a live session for good: then the unlock alone.
            Hold::Exclusive => match dialect.unlock(on, true).await {
                Ok(released) => released,
                Err(error) => match dialect.unlock(on, false).await {
                    Ok(released) => {
                        tracing::warn!(
                            component = "distlock",
                            backend = core.backend,
                            key,
                            %error,
                            "released the lock without clearing its holder record in the fencing row"
                        );
                        released
                    }
                    // The first statement's error, when the bare unlock failed
                    // too.
                    Err(_) => return Err(error),
                },
            },
        };
        if !released {
            held.lost.notify(LostReason::NotHeld);
            return Err(not_held());
        }
        // A waiter connection that carried the lock goes back to the pool.
        core.pool.recycle(held.session);
        Ok(())
    }

    /// Confirms `owner` still holds the lock on a live session: a round
    /// trip on the holding session, asking the server (cancel-safe: the
    /// question changes nothing there). A lock it no longer holds fires
    /// the lease's lost signal.
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        let id = self.id(key)?;
        validate::ttl(ttl)?;
        let dialect = dialect(self);
        let core = dialect.core();
        let not_held = || Error::NotHeld {
            key: key.to_owned(),
        };
        let Some(session) = core.registry.session_of(&id, owner) else {
            return Err(not_held());
        };
        let context = || format!("verify {key:?} is held on {}", core.target);
        let on = On::<T::Dialect> {
            session: &session,
            id: &id,
            context: &context,
        };
        if dialect.holds(on).await? {
            return Ok(());
        }
        if let Some(held) = core.registry.take(&id, owner) {
            held.lost.notify(LostReason::NotHeld);
        }
        Err(not_held())
    }

    /// One statement per batch of locks (any number on Postgres, 256 on
    /// MySQL) on each session holding some of them (all sent at once),
    /// confirming which it still holds, instead of a round trip per lock.
    /// Each lease answers as [`refresh`](Locker::refresh) would; a failed
    /// statement fails the leases it carried.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let claims = requests
            .iter()
            .map(|request| {
                let id = self.id(request.key)?;
                validate::ttl(request.ttl)?;
                Ok(Claim {
                    id,
                    owner: request.owner,
                    key: request.key,
                })
            })
            .collect();
        let dialect = dialect(self);
        let confirm = |session, ids: &[&_]| dialect.held_among(session, ids);
        let per_call = T::Dialect::HOLDS_PER_STATEMENT;
        let registry = &dialect.core().registry;
        registry.confirm_many(claims, per_call, confirm).await
    }

    async fn forget(&self, key: &str) -> Result<()> {
        dialect(self).forget(&lock_of(self, key)?).await
    }

    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        let lock = lock_of(self, name)?;
        dialect(self).advance_mark(&lock, value).await
    }

    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        let lock = lock_of(self, key)?;
        let hold = dialect(self).find_hold(&lock, "inspect").await?;
        Ok(hold.map(|(_, held)| held))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let ours = |key: &str, id: &_| self.id(key).is_ok_and(|own| own == *id);
        dialect(self).list(prefix, &ours).await
    }

    /// [`ForceRelease::TerminateSession`] only: ending the holding
    /// session, which frees **every** lock it holds (see the backend's
    /// docs on inspection).
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        let (lock, dialect) = (lock_of(self, key)?, dialect(self));
        let find = || dialect.find_hold(&lock, "force_release");
        let end = |holder| dialect.end_holder(&lock, holder);
        dialect.core().force_release(key, how, find, end).await
    }
}
