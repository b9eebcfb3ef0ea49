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

use super::pool::{Connect, Connector, OnClosed, Pool, PoolSize};
use crate::config::SqlOptions;
use crate::deadline::{bounded, checked_deadline, DEADLINE_GRACE};
use crate::inspect::{ForceRelease, HeldLock};
use crate::session_registry::{
    Busy, Held, HoldingSession, Reader, Registry, SessionClosed, Ticket,
};
use crate::{new_owner_token, Capabilities, Error, Lease, LeaseParts, Locker, Result, WaitPolicy};

/// What one attempt on a shared session found.
pub(crate) enum Tried {
    /// Taken: the lease is recorded.
    Granted(Lease),
    /// Held elsewhere, or by (or for) another caller of this locker.
    Contended,
    /// An abandoned attempt on this key is still being cleaned up.
    CleaningUp,
}

/// A wait on the server the core hands to its dialect once the first
/// attempt found the key held and a waiter connection is free.
pub(crate) struct WaitOn<S> {
    /// The waiter connection to wait on.
    pub(crate) session: Arc<S>,
    /// The owner token the lease will carry.
    pub(crate) owner: String,
    /// The locker whose leases these are (string or raw keys).
    pub(crate) lease_locker: Arc<dyn Locker>,
    started: Instant,
    deadline: Option<Instant>,
}

impl<S> WaitOn<S> {
    /// What is left until the caller's deadline.
    pub(crate) fn remaining(&self) -> Duration {
        remaining(self.deadline)
    }

    /// The answer once the deadline passed with `key` still held.
    pub(crate) fn timed_out(&self, key: &str) -> Error {
        Error::Timeout {
            key: key.to_owned(),
            waited: self.started.elapsed(),
        }
    }
}

/// How a dialect ends a native wait that nobody listens to any more.
pub(crate) trait AbandonWait<S>: Send {
    /// Ends the wait on `session` on the server (and closes the
    /// connection), so that nothing stays granted to a waiter that is
    /// gone, whether or not the lock was granted meanwhile. Called from a
    /// drop, perhaps outside a runtime: it must not block.
    fn abandon(&self, session: Arc<S>);
}

/// A native wait in progress. Dropped armed (the caller gave up, or the
/// wait failed), it hands the waiter connection to the dialect's
/// [`AbandonWait`].
pub(crate) struct WaitGuard<S, A: AbandonWait<S>> {
    session: Option<Arc<S>>,
    abandon: A,
}

impl<S, A: AbandonWait<S>> WaitGuard<S, A> {
    /// Armed for a wait on `session`.
    pub(crate) fn new(session: Arc<S>, abandon: A) -> Self {
        WaitGuard {
            session: Some(session),
            abandon,
        }
    }

    /// The wait ended (answered, or its connection closed itself).
    pub(crate) fn disarm(&mut self) {
        self.session = None;
    }

    /// Armed again, for another wait on `session` (MySQL's waits longer
    /// than its largest `GET_LOCK` timeout).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn rearm(&mut self, session: Arc<S>) {
        self.session = Some(session);
    }
}

impl<S, A: AbandonWait<S>> Drop for WaitGuard<S, A> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.abandon.abandon(session);
        }
    }
}

/// A grant's lease for `lease_locker`, and the registry's record of it.
fn lease_for<S>(
    key: &str,
    ttl: Duration,
    owner: String,
    fencing_token: Option<u64>,
    session: Arc<S>,
    lease_locker: Arc<dyn Locker>,
) -> (Lease, Held<S>) {
    let parts = LeaseParts::unexpiring(key, owner.clone(), fencing_token, ttl);
    let lease = Lease::new(parts, lease_locker);
    let held = Held {
        owner,
        session,
        lost: lease.lost_notifier(),
    };
    (lease, held)
}

/// What is left of a wait until `deadline` (`None`: no deadline at all).
pub(crate) fn remaining(deadline: Option<Instant>) -> Duration {
    deadline.map_or(Duration::MAX, |d| {
        d.saturating_duration_since(Instant::now())
    })
}

/// A key's reservation in the registry, ended when dropped: whichever way
/// the call holding it ends (answered, failed, dropped), and, when it
/// travels with a request to a session's driver, only once that request is
/// settled.
pub(crate) struct Reserved<K: Clone + Eq + Hash + fmt::Debug, S: HoldingSession> {
    registry: Arc<Registry<K, S>>,
    ticket: Option<Ticket<K>>,
}

impl<K: Clone + Eq + Hash + fmt::Debug, S: HoldingSession> Reserved<K, S> {
    /// Holds `ticket` of `registry` until dropped.
    pub(crate) fn new(registry: Arc<Registry<K, S>>, ticket: Ticket<K>) -> Self {
        Reserved {
            registry,
            ticket: Some(ticket),
        }
    }
}

impl<K: Clone + Eq + Hash + fmt::Debug, S: HoldingSession> Drop for Reserved<K, S> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.registry.release(ticket);
        }
    }
}

/// What a dialect says in the messages the core writes for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wording {
    /// How an abandoned attempt's answer went missing ("never arrived"):
    /// the caller is told why the key is still being cleaned up.
    pub(crate) unanswered: &'static str,
    /// What happened to a session that closed right after a grant, given
    /// the target and the key.
    pub(crate) lost_after_grant: fn(target: &str, key: &str) -> String,
    /// The kind of lock ("a GET_LOCK lock"), in releases and force releases.
    pub(crate) lock: &'static str,
    /// What holds it ("connection"), for refusing the force releases but
    /// the one supported (ending the holder's session).
    pub(crate) holder: &'static str,
    /// How the holder is ended ("KILL").
    pub(crate) command: &'static str,
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
    /// The pool's bounds, and whether the fencing table is in use.
    size: PoolSize,
    /// The locker's connections.
    pub(crate) pool: Arc<Pool<C>>,
    /// Which locks this locker holds, on which session, for which owner.
    pub(crate) registry: Arc<Registry<K, C::Session>>,
}

impl<T, K> Core<Connect<T>, K>
where
    Connect<T>: Connector,
    K: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static,
{
    /// A core for the server `target`, with a pool sized by `options`
    /// (no connection opened yet; `fencing`: the fencing table is used)
    /// whose sessions are opened `with` the dialect's settings, and given
    /// the hook every session calls once when its connection is gone (it
    /// tells the registry, which fires the lost signal of every lease on
    /// that session).
    pub(crate) fn new(
        backend: &'static str,
        target: String,
        options: &SqlOptions,
        fencing: bool,
        with: T,
    ) -> Self {
        let size = PoolSize {
            sessions: options.sessions,
            max_waiters: options.max_waiters,
            idle_waiters: options.idle_waiters,
            fencing,
        };
        let registry = Arc::new(Registry::new(backend));
        let weak: Weak<Registry<K, <Connect<T> as Connector>::Session>> = Arc::downgrade(&registry);
        let on_closed: OnClosed = Arc::new(move |session_id, why, grace| {
            if let Some(registry) = weak.upgrade() {
                registry.session_closed(session_id, why, grace);
            }
        });
        Core {
            backend,
            target,
            query_timeout: options.query_timeout,
            size,
            pool: Arc::new(Pool::new(Connect { with, on_closed }, size)),
            registry,
        }
    }
}

impl<C, K> Core<C, K>
where
    C: Connector,
    K: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static,
{
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
                self.target,
                C::WORDING.unanswered,
                self.query_timeout
            ),
        )
    }

    /// `try_lock`'s answer from one attempt: `Ok(None)` if the key is held
    /// elsewhere (or by another caller of this locker).
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] while an abandoned attempt on the key is still
    /// being cleaned up (see [`cleanup_pending`](Self::cleanup_pending)).
    pub(crate) fn try_answer(&self, tried: Tried, key: &str) -> Result<Option<Lease>> {
        match tried {
            Tried::Granted(lease) => Ok(Some(lease)),
            Tried::Contended => Ok(None),
            Tried::CleaningUp => Err(self.cleanup_pending(key, "acquire")),
        }
    }

    /// `lock` (or with `shared`, `lock_shared`): with a zero `timeout`, one
    /// attempt (`try_once`), contention being [`Error::NotAcquired`].
    /// Otherwise one attempt first (most locks are free: one round trip on
    /// a shared session, and the lock lives there rather than on a
    /// connection of its own), then a wait on the server on a waiter
    /// connection (`wait_on`, given a fresh owner token and the deadline in
    /// a [`WaitOn`]), or, when all `max_waiters` are in use,
    /// [`poll`](Self::poll) through `lease_locker`, the locker whose
    /// `try_lock(key)` (or `try_lock_shared(key)`) is `try_once`.
    ///
    /// A wait returns within `timeout` + [`DEADLINE_GRACE`] whatever the
    /// server does: past that, the call is abandoned (the dialect's guards
    /// undo whatever the server did) with [`Error::DeadlineExceeded`].
    ///
    /// # Errors
    ///
    /// As above, and whatever the attempt, opening a waiter connection,
    /// the wait or polling fails with.
    ///
    /// # Cancel safety
    ///
    /// As the attempt and the wait: the dialect's guards make both
    /// cancel-safe.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn lock<Once, Wait>(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
        shared: bool,
        lease_locker: Arc<dyn Locker>,
        try_once: impl FnOnce(Arc<dyn Locker>) -> Once,
        wait_on: impl FnOnce(WaitOn<C::Session>) -> Wait,
    ) -> Result<Lease>
    where
        Once: Future<Output = Result<Tried>>,
        Wait: Future<Output = Result<Lease>>,
    {
        if timeout.is_zero() {
            return self
                .try_answer(try_once(lease_locker).await?, key)?
                .ok_or_else(|| Error::NotAcquired {
                    key: key.to_owned(),
                });
        }
        let started = Instant::now();
        // `None` for a timeout too long for an `Instant`: no deadline at all.
        let deadline = checked_deadline(started, timeout);
        let steps = async move {
            match try_once(lease_locker.clone()).await? {
                Tried::Granted(lease) => return Ok(lease),
                // A pending cleanup may hold the key on its shared session;
                // the server orders a native wait after it, like after any
                // holder.
                Tried::Contended | Tried::CleaningUp => {}
            }
            match self.pool.waiter().await? {
                Some(session) => {
                    let owner = new_owner_token();
                    wait_on(WaitOn {
                        session,
                        owner,
                        lease_locker,
                        started,
                        deadline,
                    })
                    .await
                }
                None => {
                    let remaining = remaining(deadline);
                    self.poll(&*lease_locker, key, ttl, shared, started, remaining)
                        .await
                }
            }
        };
        let limit = timeout.saturating_add(DEADLINE_GRACE);
        bounded(self.backend, "acquire", limit, steps).await
    }

    /// Waits by polling, when all `max_waiters` waiter connections are in
    /// use: the waiting loop every backend without a server-side wait uses
    /// (`try_lock`, or with `shared` `try_lock_shared`, through
    /// `lease_locker` with jittered backoff, bounded by `remaining`), so
    /// contention, timeouts and outages are reported as there. It does not switch to a native wait if a connection frees up
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
        shared: bool,
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
            max_waiters = self.size.max_waiters,
            "every waiter connection is in use; polling"
        );
        let policy = WaitPolicy::default();
        let polled = crate::wait::acquire_as(lease_locker, key, ttl, remaining, &policy, shared);
        match polled.await {
            // The loop measured only its own part of the wait.
            Err(Error::Timeout { .. }) => Err(timed_out()),
            other => other,
        }
    }

    /// Turns a grant of `id` on `session` into a lease and records it:
    /// the holder's, or with `shared` a reader's (one attempt's or one
    /// native wait's), carrying `fencing_token` (for a reader, the key's
    /// counter, read after the grant, not advanced).
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
        shared: bool,
    ) -> Result<Lease> {
        if HoldingSession::is_closed(&*session) {
            return Err(self.closed_after_grant(key));
        }
        let (lease, held) = lease_for(key, ttl, owner, fencing_token, session, lease_locker);
        let recorded = if shared {
            let reader = Reader {
                held,
                fencing_token,
            };
            self.registry.grant_shared(id, reader)
        } else {
            self.registry.grant(id, held)
        };
        recorded.map_err(|SessionClosed| self.closed_after_grant(key))?;
        Ok(lease)
    }

    /// A reader joining the shared hold `session` has of `id` for another
    /// reader of this locker (see [`Registry::reserve_shared`]): its lease,
    /// with the hold's `fencing_token`, or `None` if that hold ended
    /// meanwhile (the caller then makes an attempt of its own).
    pub(crate) fn join(
        &self,
        id: &K,
        key: &str,
        ttl: Duration,
        fencing_token: Option<u64>,
        session: Arc<C::Session>,
        lease_locker: Arc<dyn Locker>,
    ) -> Option<Lease> {
        let owner = new_owner_token();
        let (lease, held) = lease_for(key, ttl, owner, fencing_token, session, lease_locker);
        if self.registry.join(
            id,
            Reader {
                held,
                fencing_token,
            },
        ) {
            return Some(lease);
        }
        // Never recorded, so nothing to release: dropped quietly.
        drop(lease.with_sync_release(|| {}));
        None
    }

    /// The error for a grant whose session closed before it was recorded.
    fn closed_after_grant(&self, key: &str) -> Error {
        Error::backend(
            self.backend,
            "acquire",
            (C::WORDING.lost_after_grant)(&self.target, key),
        )
    }

    /// Reserves `id` for a [`Locker::forget`], exactly as an attempt would
    /// be: while reserved, no lease or attempt of this locker holds it on
    /// one of its sessions, so the forget's own server lock can only be
    /// refused by *another* session, never granted re-entrantly over a
    /// lock of ours.
    ///
    /// # Errors
    ///
    /// [`Error::NotAcquired`] while this locker holds or takes it;
    /// [`Error::Backend`] while an abandoned attempt on it is cleaned up.
    pub(crate) fn reserve_to_forget(&self, id: K, key: &str) -> Result<Reserved<K, C::Session>> {
        match self.registry.reserve(id) {
            Ok(ticket) => Ok(Reserved::new(self.registry.clone(), ticket)),
            Err(Busy::Contended) => Err(Error::NotAcquired {
                key: key.to_owned(),
            }),
            Err(Busy::CleaningUp) => Err(self.cleanup_pending(key, "forget")),
        }
    }

    /// The answer to a release of a lock this locker does not hold (it
    /// cannot release it: only the session holding a session lock can),
    /// given what the server said: `holder` describes the holding session
    /// ("server process 42") and how to end it (`pg_terminate_backend(42)`),
    /// `None` if nobody holds it; `same_owner` whether the holder's fencing
    /// row names the caller's owner token (`None` without a fencing table).
    ///
    /// [`Error::Unsupported`] if another client may hold it under `owner`,
    /// [`Error::NotHeld`] if nobody holds it under `owner`.
    pub(crate) fn held_elsewhere(
        &self,
        key: &str,
        holder: Option<(String, String)>,
        same_owner: Option<bool>,
    ) -> Error {
        let not_held = || Error::NotHeld {
            key: key.to_owned(),
        };
        let Some((who, end)) = holder else {
            return not_held();
        };
        let lock = C::WORDING.lock;
        let reason = match same_owner {
            Some(false) => return not_held(),
            Some(true) => format!(
                "{key:?} is held under this owner token by another client ({who}); {lock} can only \
                 be released by the session holding it: release it from that client, or end its \
                 session ({end}) to free it"
            ),
            None => format!(
                "{key:?} is held by {who}; without the fencing table this client cannot tell \
                 whether under this owner token, and only the session holding it can release it"
            ),
        };
        Error::unsupported(self.backend, "release", reason)
    }
}

impl<C, K> Core<C, K>
where
    C: Connector,
    K: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static,
{
    /// [`Locker::force_release`] by ending the holding session, the only
    /// way a session lock can be freed by anyone but its session: `find`
    /// looks the hold up (its holder and what inspection says of it, or
    /// `None` when free), `end` ends that holder if it still holds the
    /// lock (false when it no longer did: the lock changed hands, so look
    /// again, a few times).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for any `how` but
    /// [`ForceRelease::TerminateSession`]; [`Error::Backend`] when the lock
    /// kept changing hands; `find`'s and `end`'s errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe past the first `end`: a holder may be ended without
    /// the caller learning it.
    pub(crate) async fn force_release<Holder, Found, Ended>(
        &self,
        key: &str,
        how: ForceRelease,
        find: impl FnMut() -> Found,
        mut end: impl FnMut(Holder) -> Ended,
    ) -> Result<Option<HeldLock>>
    where
        Found: Future<Output = Result<Option<(Holder, HeldLock)>>>,
        Ended: Future<Output = Result<bool>>,
    {
        if how != ForceRelease::TerminateSession {
            let Wording {
                lock,
                holder,
                command,
                ..
            } = C::WORDING;
            return Err(Error::unsupported(
                self.backend,
                "force_release",
                format!(
                    "{how:?}: {lock} can only be released by the {holder} holding it; \
                     ForceRelease::TerminateSession ends that {holder} ({command}), which frees \
                     EVERY lock it holds (distlock shares one {holder} among many locks) and fires \
                     all their holders' lost signals"
                ),
            ));
        }
        let evict = |(holder, held): (Holder, HeldLock)| {
            let ended = end(holder);
            // Not ended: released (and maybe taken again) since it was
            // inspected.
            async move { Ok(ended.await?.then_some(held)) }
        };
        crate::inspect::release_holder(self.backend, key, how, find, evict).await
    }

    /// What a SQL session-lock backend can do: fencing tokens and `list`
    /// only with the fencing table (only that table names the locks).
    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities {
            expires: false,
            unlock_by_owner: false,
            // The server-side wait wakes waiters; nothing announces releases.
            release_notifications: false,
            fencing: self.size.fencing,
            list: self.size.fencing,
            // Each dialect says whether it has shared locks (`NO_SHARED_LOCKS`).
            shared: false,
            ..Capabilities::ALL
        }
    }

    /// The `Debug` of the locker `name` in `namespace`: its server (never
    /// with a password), its connection bounds and how many locks it holds.
    pub(crate) fn debug_locker(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &str,
        namespace: &str,
    ) -> fmt::Result {
        f.debug_struct(name)
            .field("target", &self.target)
            .field("namespace", &namespace)
            .field("fencing", &self.size.fencing)
            .field("sessions", &self.size.sessions)
            .field("max_waiters", &self.size.max_waiters)
            .field("held", &self.registry.held_count())
            .finish_non_exhaustive()
    }
}
