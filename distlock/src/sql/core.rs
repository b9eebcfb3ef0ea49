//! The locker core a SQL dialect plugs into: its pool, the registry of the
//! locks it holds, and the steps of acquire, release and verify that do not
//! depend on the server's SQL.
//!
//! A backend's locker owns a [`Core`] and writes only its statements:
//! sending them, bounding them and reading their answers. Everything that
//! decides what an answer means for the caller and for the registry (a
//! grant that lands on a dead session, a release nobody here holds, an
//! abandoned attempt still being cleaned up, polling once every waiter
//! connection is in use) is decided here, once.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::pool::{Connector, OnClosed, Pool};
use crate::session_registry::{Busy, Held, HoldingSession, Registry, SessionClosed};
use crate::{Capabilities, Error, Lease, LeaseParts, Locker, LostReason, Result, WaitPolicy};

/// What a dialect says in the messages the core writes for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wording {
    /// How an abandoned attempt's answer went missing ("never arrived"):
    /// the caller is told why the key is still being cleaned up.
    pub(crate) unanswered: &'static str,
    /// What happened to a session that closed right after a grant, given
    /// the target and the key.
    pub(crate) lost_after_grant: fn(target: &str, key: &str) -> String,
}

/// The parts of a SQL locker every dialect shares (see the
/// [module docs](self)). `K` is the server's identity of a lock (an
/// advisory key, a lock name).
pub(crate) struct Core<C: Connector, K> {
    /// The backend's name in errors and logs.
    pub(crate) backend: &'static str,
    /// The server, as errors name it (never with a password).
    pub(crate) target: String,
    /// The bound on one statement.
    pub(crate) query_timeout: Duration,
    /// Waiter connections at most (for the log line when polling).
    pub(crate) max_waiters: usize,
    /// The locker's connections.
    pub(crate) pool: Arc<Pool<C>>,
    /// Which locks this locker holds, on which session, for which owner.
    pub(crate) registry: Arc<Registry<K, C::Session>>,
    wording: Wording,
}

impl<C, K> Core<C, K>
where
    C: Connector,
    K: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static,
{
    /// A core whose pool `make_pool` builds, given the hook every session
    /// calls once when its connection is gone (it tells the registry, which
    /// fires the lost signal of every lease on that session).
    pub(crate) fn new(
        backend: &'static str,
        target: String,
        query_timeout: Duration,
        max_waiters: usize,
        wording: Wording,
        make_pool: impl FnOnce(OnClosed) -> Pool<C>,
    ) -> Self {
        let registry = Arc::new(Registry::new(backend));
        let weak: Weak<Registry<K, C::Session>> = Arc::downgrade(&registry);
        let on_closed: OnClosed = Arc::new(move |session_id, why, grace| {
            if let Some(registry) = weak.upgrade() {
                registry.session_closed(session_id, why, grace);
            }
        });
        Core {
            backend,
            target,
            query_timeout,
            max_waiters,
            pool: Arc::new(make_pool(on_closed)),
            registry,
            wording,
        }
    }

    /// The answer while an abandoned attempt's cleanup holds the key's
    /// reservation: the server may hold the lock for nobody (the attempt
    /// took it, its answer was lost) until the cleanup releases it, so
    /// neither "held elsewhere" nor "not held" would be true.
    pub(crate) fn cleanup_pending(&self, key: &str, operation: &'static str) -> Error {
        Error::backend(
            self.backend,
            operation,
            format!(
                "an earlier attempt on {key:?} is still being cleaned up (its answer from {} {}, \
                 so it may hold the lock for nobody); retry once the cleanup ends, within {:?}",
                self.target, self.wording.unanswered, self.query_timeout
            ),
        )
    }

    /// Waits by polling, when all `max_waiters` waiter connections are in
    /// use: the waiting loop every backend without a server-side wait uses
    /// (`try_lock` through `lease_locker` with jittered backoff, bounded by
    /// `remaining`), so contention, timeouts and outages are reported as
    /// there. It does not switch to a native wait if a connection frees up
    /// meanwhile.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (counted from `started`) once `remaining` has
    /// passed, or whatever an attempt fails with.
    ///
    /// # Cancel safety
    ///
    /// As the attempts it makes: cancel-safe.
    pub(crate) async fn poll(
        &self,
        lease_locker: &dyn Locker,
        key: &str,
        ttl: Duration,
        started: Instant,
        remaining: Duration,
    ) -> Result<Lease> {
        let timed_out = || Error::Timeout {
            key: key.to_owned(),
            waited: started.elapsed(),
        };
        // A zero timeout means "one attempt, contention is NotAcquired" to
        // the loop; here the caller's (non-zero) timeout has simply run out.
        if remaining.is_zero() {
            return Err(timed_out());
        }
        tracing::debug!(
            component = "distlock",
            backend = self.backend,
            key,
            max_waiters = self.max_waiters,
            "every waiter connection is in use; polling"
        );
        let policy = WaitPolicy::default();
        match crate::wait::acquire(lease_locker, key, ttl, remaining, &policy).await {
            // The loop measured only its own part of the wait.
            Err(Error::Timeout { .. }) => Err(timed_out()),
            other => other,
        }
    }

    /// Turns a grant of `id` on `session` into a lease and records it.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] if the session closed before the grant was
    /// recorded: the server frees the lock with the session.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grant(
        &self,
        id: K,
        key: &str,
        ttl: Duration,
        owner: String,
        fencing_token: Option<u64>,
        session: Arc<C::Session>,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Lease> {
        let closed_after_grant = || {
            Error::backend(
                self.backend,
                "acquire",
                (self.wording.lost_after_grant)(&self.target, key),
            )
        };
        if HoldingSession::is_closed(&*session) {
            return Err(closed_after_grant());
        }
        let lease = Lease::new(
            LeaseParts {
                key: key.to_owned(),
                owner: owner.clone(),
                fencing_token,
                ttl,
                valid_until: None,
            },
            lease_locker,
        );
        let held = Held {
            owner,
            session,
            lost: lease.lost_notifier(),
        };
        self.registry
            .grant(id, held)
            .map_err(|SessionClosed| closed_after_grant())?;
        Ok(lease)
    }

    /// The first step of a release: `owner`'s hold of `id` through this
    /// locker, taken out of the registry, or `None` when the server must be
    /// asked who holds it (nothing here holds or takes it).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if this locker holds (or is taking) it under
    /// another owner; [`Error::Backend`] while an abandoned attempt on it
    /// is still being cleaned up (the server cannot be asked until then).
    pub(crate) fn take_for_release(
        &self,
        id: &K,
        key: &str,
        owner: &str,
    ) -> Result<Option<Held<C::Session>>> {
        // The entry is gone before the unlock is queued, with no await in
        // between: an attempt on this key that now reserves it and reaches
        // the same session is ordered after the unlock by the server.
        if let Some(held) = self.registry.take(id, owner) {
            return Ok(Some(held));
        }
        match self.registry.state(id) {
            Some(Busy::Contended) => Err(Error::NotHeld {
                key: key.to_owned(),
            }),
            Some(Busy::CleaningUp) => Err(self.cleanup_pending(key, "release")),
            None => Ok(None),
        }
    }

    /// Runs a release statement that also clears the holder record; if it
    /// fails, runs `bare` (the unlock alone) instead. The record is cleared
    /// before the unlock in the same statement, so when clearing failed
    /// (its row locked by another client past the session's lock timeout)
    /// the unlock never ran, and the lock would stay on a live session for
    /// good.
    ///
    /// # Errors
    ///
    /// The first statement's error, when the bare unlock failed too.
    ///
    /// # Cancel safety
    ///
    /// As the statements: dropping it leaves the lock to its session.
    pub(crate) async fn unlock_or_bare<T, Bare>(
        &self,
        key: &str,
        first: impl Future<Output = Result<T>>,
        bare: impl FnOnce() -> Bare,
    ) -> Result<T>
    where
        Bare: Future<Output = Result<T>>,
    {
        let error = match first.await {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        match bare().await {
            Ok(answer) => {
                tracing::warn!(
                    component = "distlock",
                    backend = self.backend,
                    key,
                    %error,
                    "released the lock without clearing its holder record in the fencing row"
                );
                Ok(answer)
            }
            Err(_) => Err(error),
        }
    }

    /// The last step of a release: a waiter connection that carried the
    /// lock goes back to the pool; a lock the session no longer held (the
    /// server freed it: something released it by hand on the session)
    /// fires the lease's lost signal.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when `released` is false.
    pub(crate) fn finish_release(
        &self,
        held: Held<C::Session>,
        key: &str,
        released: bool,
    ) -> Result<()> {
        if released {
            self.pool.recycle(held.session);
            return Ok(());
        }
        held.lost.notify(LostReason::NotHeld);
        Err(Error::NotHeld {
            key: key.to_owned(),
        })
    }

    /// Confirms `owner` still holds `id` on a live session: `holds` asks
    /// the holding session; a lock it no longer holds fires the lease's
    /// lost signal.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if this locker does not hold it under `owner`,
    /// or the session says it does not; `holds`'s error otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the question changes nothing on the server.
    pub(crate) async fn verify<Holds>(
        &self,
        id: &K,
        key: &str,
        owner: &str,
        holds: impl FnOnce(Arc<C::Session>) -> Holds,
    ) -> Result<()>
    where
        Holds: Future<Output = Result<bool>>,
    {
        let not_held = || Error::NotHeld {
            key: key.to_owned(),
        };
        let Some(session) = self.registry.session_of(id, owner) else {
            return Err(not_held());
        };
        if holds(session).await? {
            return Ok(());
        }
        if let Some(held) = self.registry.take(id, owner) {
            held.lost.notify(LostReason::NotHeld);
        }
        Err(not_held())
    }
}

/// What a SQL session-lock backend can do; `fencing` says whether its
/// fencing table is in use (only that table names the locks, for `list`).
pub(crate) fn capabilities(fencing: bool) -> Capabilities {
    Capabilities {
        expires: false,
        refresh: true,
        unlock_by_owner: false,
        release_wakeup: true,
        // The server-side wait wakes waiters; nothing announces releases.
        release_notifications: false,
        fencing,
        marks: true,
        inspect: true,
        list: fencing,
        force_release: true,
    }
}
