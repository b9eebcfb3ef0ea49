//! The connections of one locker: a fixed number of shared sessions, and
//! connections for native waits. The same for every dialect; how a
//! connection is opened is the dialect's ([`Connector`]).
//!
//! This is deliberately not a general-purpose pool: a connection carrying a
//! lock is never handed to anyone else, never reset, and never closed while
//! it carries a lock, except to give up every lock on it at once. General
//! pools do exactly those things on return: deadpool-postgres' `Clean`
//! recycling runs `pg_advisory_unlock_all()` and its `Fast` recycling hands
//! a lock-holding connection to the next user (its `RecyclingMethod` docs);
//! `mysql_async::Pool` resets a returned connection
//! (`COM_RESET_CONNECTION`), which silently releases every `GET_LOCK`.
//!
//! - Shared sessions: `sessions` slots, opened lazily; a key always maps to
//!   the same slot ([`SlotKey`]), so every attempt on a key is ordered on
//!   one connection. They carry the locks taken without waiting, any
//!   number of them.
//! - Waiter connections: a native wait blocks its connection (a waiting
//!   statement on a shared session would stall every other lock on it).
//!   Each wait gets a connection of its own, which then carries the one
//!   lock it won until release; after that, up to `idle_waiters` are kept
//!   for the next wait.
//! - At most `max_waiters` waiter connections exist at once, idle ones
//!   included: each holds a semaphore permit for as long as it is open.
//!   Without that cap, a burst of waits on held keys would open one
//!   connection each and could exhaust the server's `max_connections`.
//!   When no permit is left, [`Pool::waiter`] says so and the caller polls
//!   on the shared sessions instead.

use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::core::Wording;
use crate::session_registry::HoldingSession;
use crate::Result;

/// What a connection of the pool is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// One of the `sessions` shared sessions, carrying many locks.
    Shared,
    /// A connection for one native wait, then for the one lock it won.
    Waiter,
}

/// Called once, from the session's driver, when its connection is gone (or
/// given up as silent): with the session's id, why, and how long its locks
/// may still be held on the server (what is left of the dialect's server
/// window since the server was last heard, when it went silent; zero
/// otherwise).
pub(crate) type OnClosed = Arc<dyn Fn(u64, &str, std::time::Duration) + Send + Sync>;

/// A session as the pool sees it: what the registry sees
/// ([`HoldingSession`]: its id, whether it is closed), and its role.
pub(crate) trait PooledSession: HoldingSession + 'static {
    /// What the session was opened for.
    fn role(&self) -> Role;
}

/// Implements [`PooledSession`], [`HoldingSession`] and `Debug` for a
/// dialect's session type, which has `id: u64` and `role: Role` fields and
/// an `is_closed(&self) -> bool` method: every dialect's session answers
/// the pool and the registry the same way.
macro_rules! pooled_session {
    ($session:ty) => {
        impl std::fmt::Debug for $session {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Session")
                    .field("id", &self.id)
                    .field("role", &self.role)
                    .field("closed", &self.is_closed())
                    .finish()
            }
        }

        impl $crate::sql::pool::PooledSession for $session {
            fn role(&self) -> $crate::sql::pool::Role {
                self.role
            }
        }

        impl $crate::session_registry::HoldingSession for $session {
            fn id(&self) -> u64 {
                self.id
            }
            fn is_closed(&self) -> bool {
                <$session>::is_closed(self)
            }
        }
    };
}
pub(crate) use pooled_session;

/// What a session is opened as, and with.
pub(crate) struct Opening {
    /// The session's number, unique in its locker.
    pub(crate) id: u64,
    /// What it is for.
    pub(crate) role: Role,
    /// A waiter's place under `max_waiters`, held for as long as the
    /// session is open (dropping the session returns it, so no path can
    /// leak it).
    pub(crate) waiter_permit: Option<OwnedSemaphorePermit>,
    /// The fencing table must be created (or upgraded) on the new
    /// connection before it is used.
    pub(crate) ensure_table: bool,
}

/// A dialect's connector: what it opens its sessions `with` (its
/// settings), and the hook every session calls once when its connection is
/// gone.
pub(crate) struct Connect<T> {
    /// The dialect's settings (and anything else its sessions need).
    pub(crate) with: T,
    /// Tells the core's registry that a session's connection is gone.
    pub(crate) on_closed: OnClosed,
}

/// How a dialect opens a session, and words what the core says of them.
pub(crate) trait Connector: Send + Sync + 'static {
    /// The dialect's session.
    type Session: PooledSession;

    /// How the shared core words this dialect's messages.
    const WORDING: Wording;

    /// Opens a session as `opening` says.
    ///
    /// # Errors
    ///
    /// The server's refusal or silence, as the dialect reports it.
    fn open(&self, opening: Opening) -> impl Future<Output = Result<Arc<Self::Session>>> + Send;
}

/// A lock's identity as the pool spreads it over the shared sessions.
pub(crate) trait SlotKey {
    /// A number that stays the same for the key for the life of the
    /// process and spreads keys evenly.
    fn spread(&self) -> u64;
}

impl SlotKey for i64 {
    fn spread(&self) -> u64 {
        // Keys are uniform (SHA-256) or chosen by the caller (raw keys,
        // often sequential); both spread evenly modulo the slot count.
        *self as u64
    }
}

impl SlotKey for str {
    fn spread(&self) -> u64 {
        // `DefaultHasher::new` is SipHash with fixed keys: the same slot for
        // a name for the life of the process, which is all that is needed.
        let mut hasher = DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }
}

impl SlotKey for String {
    fn spread(&self) -> u64 {
        self.as_str().spread()
    }
}

/// How many connections of each kind a pool keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolSize {
    /// Shared sessions (at least 1).
    pub(crate) sessions: usize,
    /// Waiter connections open at once, idle ones included; within
    /// [`Semaphore::MAX_PERMITS`] (the settings check it).
    pub(crate) max_waiters: usize,
    /// Idle waiter connections kept for the next wait.
    pub(crate) idle_waiters: usize,
    /// Whether the fencing table must exist before the first session is
    /// used.
    pub(crate) fencing: bool,
}

/// A shared-session slot: its session once opened. Locked across the
/// connect, so that concurrent callers for one slot wait for one connect.
type Slot<S> = tokio::sync::Mutex<Option<Arc<S>>>;

/// The connections of one locker (see the [module docs](self)).
pub(crate) struct Pool<C: Connector> {
    connector: C,
    size: PoolSize,
    slots: Box<[Slot<C::Session>]>,
    idle_waiters: Mutex<Vec<Arc<C::Session>>>,
    /// `max_waiters` permits; every open waiter connection holds one.
    waiter_permits: Arc<Semaphore>,
    next_id: AtomicU64,
    /// Set once the fencing table is known to exist.
    table_ready: AtomicBool,
}

impl<C: Connector> Pool<C> {
    /// A pool opening its connections through `connector`; none is opened
    /// yet.
    pub(crate) fn new(connector: C, size: PoolSize) -> Self {
        let slots = (0..size.sessions.max(1))
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        Pool {
            connector,
            waiter_permits: Arc::new(Semaphore::new(size.max_waiters)),
            size,
            slots,
            idle_waiters: Mutex::default(),
            next_id: AtomicU64::new(1),
            table_ready: AtomicBool::new(false),
        }
    }

    /// The dialect's connector.
    // Only MySQL opens a connection outside the pool (for the marks table).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn connector(&self) -> &C {
        &self.connector
    }

    /// A fresh session id, for a connection the dialect opens outside the
    /// pool (so that ids stay unique per locker).
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The shared session for `key`, opened (or reopened, if it died) now if
    /// needed. Concurrent callers for one slot wait for one connect.
    ///
    /// # Errors
    ///
    /// Opening the session failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a session opened for a cancelled caller is dropped
    /// (closed) or kept in its slot; it carries no lock yet.
    pub(crate) async fn shared<K: SlotKey + ?Sized>(&self, key: &K) -> Result<Arc<C::Session>> {
        let slot = &self.slots[slot_of(key.spread(), self.slots.len())];
        let mut current = slot.lock().await;
        if let Some(session) = current.as_ref().filter(|s| !s.is_closed()) {
            return Ok(session.clone());
        }
        let session = self.open(Role::Shared, None).await?;
        *current = Some(session.clone());
        Ok(session)
    }

    /// A connection for a native wait: an idle one if any is alive, else a
    /// new one if fewer than `max_waiters` are open, else `None` (the caller
    /// polls instead).
    ///
    /// # Errors
    ///
    /// Opening a new connection failed (its permit goes back).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a connection being opened is dropped with its permit.
    pub(crate) async fn waiter(&self) -> Result<Option<Arc<C::Session>>> {
        let idle = {
            let mut idle = self
                .idle_waiters
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A dead idle connection still holds its permit: drop them all
            // before asking for one, or dead connections could keep every
            // permit and force polling with nothing open.
            idle.retain(|session| !session.is_closed());
            idle.pop()
        };
        if let Some(session) = idle {
            return Ok(Some(session));
        }
        // `try_acquire_owned` fails only when no permit is left: the semaphore
        // is never closed.
        let Ok(permit) = self.waiter_permits.clone().try_acquire_owned() else {
            return Ok(None);
        };
        // If opening fails, the permit goes back with the error.
        self.open(Role::Waiter, Some(permit)).await.map(Some)
    }

    /// Takes back a waiter connection that carries no lock: kept for the
    /// next wait if there is room, else closed (by dropping it). A shared
    /// session is left alone.
    pub(crate) fn recycle(&self, session: Arc<C::Session>) {
        if session.role() != Role::Waiter || session.is_closed() {
            return;
        }
        let mut idle = self
            .idle_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.size.idle_waiters {
            idle.push(session);
        }
    }

    async fn open(
        &self,
        role: Role,
        waiter_permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Arc<C::Session>> {
        let ensure_table = self.size.fencing && !self.table_ready.load(Ordering::Acquire);
        let opening = Opening {
            id: self.next_id(),
            role,
            waiter_permit,
            ensure_table,
        };
        let session = self.connector.open(opening).await?;
        self.table_ready.store(true, Ordering::Release);
        Ok(session)
    }
}

#[cfg(test)]
impl<C: Connector> Pool<C> {
    /// Waiter connections open and not idle: waiting, or carrying a lock.
    pub(crate) fn waiters_in_use(&self) -> usize {
        (self.size.max_waiters - self.waiter_permits.available_permits())
            .saturating_sub(self.idle_count())
    }

    /// Idle waiter connections kept.
    pub(crate) fn idle_count(&self) -> usize {
        self.idle_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The oldest idle waiter connection, if any.
    pub(crate) fn first_idle(&self) -> Option<Arc<C::Session>> {
        self.idle_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first()
            .cloned()
    }

    /// Waiter permits not taken.
    pub(crate) fn free_permits(&self) -> usize {
        self.waiter_permits.available_permits()
    }
}

/// The shared-session slot of a key that spreads to `spread`.
fn slot_of(spread: u64, slots: usize) -> usize {
    (spread % slots as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_maps_to_a_slot() {
        for key in [i64::MIN, -1, 0, 1, 7, i64::MAX] {
            assert!(slot_of(key.spread(), 4) < 4);
        }
        let spread: std::collections::HashSet<_> =
            (0..8_i64).map(|k| slot_of(k.spread(), 4)).collect();
        assert_eq!(spread.len(), 4);
    }

    #[test]
    fn names_spread_over_the_slots() {
        let spread: std::collections::HashSet<_> = (0..64)
            .map(|k| slot_of(format!("key-{k}").spread(), 4))
            .collect();
        assert_eq!(spread.len(), 4);
        assert_eq!(slot_of("a".spread(), 4), slot_of("a".spread(), 4));
    }
}
