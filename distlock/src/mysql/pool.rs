//! The connections of one locker: a fixed number of shared sessions, and
//! connections for native waits.
//!
//! Deliberately not `mysql_async::Pool`: a connection returned to that pool
//! is reset (`COM_RESET_CONNECTION`), which silently releases every
//! `GET_LOCK` it holds, and may be handed to another user while it holds
//! one. Here a connection carrying a lock is never handed to anyone else,
//! never reset, and never closed while it carries a lock, except to give up
//! every lock on it at once.
//!
//! - Shared sessions: `sessions` slots, opened lazily; a lock name always
//!   maps to the same slot, so every attempt on a key is ordered on one
//!   connection. They carry the locks taken without waiting, any number of
//!   them (MySQL 5.7+ and MariaDB 10.0.2+ let one session hold many named
//!   locks).
//! - Waiter connections: a native wait (`GET_LOCK(name, seconds)`) blocks
//!   its connection, so each gets one of its own, which then carries the
//!   one lock it won until release; after that, up to `idle_waiters` are
//!   kept for the next wait. At most `max_waiters` are open at once, idle
//!   ones included (each holds a semaphore permit while open); when none is
//!   left, [`Pool::waiter`] says so and the caller polls instead.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::config::Settings;
use super::fencing::{ensure_table, Sql, RECORD_COLUMNS};
use super::marks;
use super::session::{OnClosed, Role, Session};
use crate::Result;

pub(super) struct Pool {
    settings: Arc<Settings>,
    slots: Box<[tokio::sync::Mutex<Option<Arc<Session>>>]>,
    idle_waiters: Mutex<Vec<Arc<Session>>>,
    /// `max_waiters` permits; every open waiter connection holds one.
    waiter_permits: Arc<Semaphore>,
    next_id: AtomicU64,
    on_closed: OnClosed,
    /// Set once the fencing table is known to exist.
    table_ready: AtomicBool,
}

impl Pool {
    pub(super) fn new(settings: Arc<Settings>, on_closed: OnClosed) -> Self {
        let waiter_permits = Arc::new(Semaphore::new(settings.max_waiters));
        let slots = (0..settings.sessions)
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        Pool {
            settings,
            slots,
            idle_waiters: Mutex::default(),
            waiter_permits,
            next_id: AtomicU64::new(1),
            on_closed,
            table_ready: AtomicBool::new(false),
        }
    }

    /// The shared session for lock `name`, opened (or reopened, if it died)
    /// now if needed. Concurrent callers for one slot wait for one connect.
    pub(super) async fn shared(&self, name: &str) -> Result<Arc<Session>> {
        let slot = &self.slots[slot_of(name, self.slots.len())];
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
    pub(super) async fn waiter(&self) -> Result<Option<Arc<Session>>> {
        let idle = {
            let mut idle = self
                .idle_waiters
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A dead idle connection may still hold its permit.
            idle.retain(|session| !session.is_closed());
            idle.pop()
        };
        if let Some(session) = idle {
            return Ok(Some(session));
        }
        // Fails only when no permit is left: the semaphore is never closed.
        let Ok(permit) = self.waiter_permits.clone().try_acquire_owned() else {
            return Ok(None);
        };
        self.open(Role::Waiter, Some(permit)).await.map(Some)
    }

    /// Takes back a waiter connection that carries no lock: kept for the
    /// next wait if there is room, else closed (by dropping it).
    pub(super) fn recycle(&self, session: Arc<Session>) {
        if session.role != Role::Waiter || session.is_closed() {
            return;
        }
        let mut idle = self
            .idle_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.settings.idle_waiters {
            idle.push(session);
        }
    }

    async fn open(
        &self,
        role: Role,
        waiter_permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Arc<Session>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (session, mut conn, incoming) = Session::open(&self.settings, id, role).await?;
        if let Some(table) = &self.settings.fencing {
            if !self.table_ready.load(Ordering::Acquire) {
                let create = Sql::create_table(table);
                ensure_table(
                    &mut conn,
                    table,
                    &create,
                    &RECORD_COLUMNS,
                    self.settings.query_timeout,
                )
                .await?;
                self.table_ready.store(true, Ordering::Release);
            }
        }
        session.start(
            conn,
            incoming,
            self.settings.clone(),
            waiter_permit,
            self.on_closed.clone(),
        );
        Ok(session)
    }

    /// Creates the marks table on a fresh connection of its own, unless it
    /// exists (see [`marks`]).
    pub(super) async fn ensure_marks_table(&self) -> Result<()> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (session, mut conn, incoming) = Session::open(&self.settings, id, Role::Waiter).await?;
        let table = marks::table(self.settings.fencing.as_ref());
        let created = ensure_table(
            &mut conn,
            &table,
            &marks::create_table(&table),
            &[],
            self.settings.query_timeout,
        )
        .await;
        drop((session, incoming));
        let _ = tokio::time::timeout(self.settings.query_timeout, conn.disconnect()).await;
        created
    }
}

/// The shared-session slot of a lock name.
fn slot_of(name: &str, slots: usize) -> usize {
    // `DefaultHasher::new` is SipHash with fixed keys: the same slot for a
    // name for the life of the process, which is all that is needed.
    let mut hasher = DefaultHasher::new();
    name.hash(&mut hasher);
    (hasher.finish() % slots as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_spread_over_the_slots() {
        let spread: std::collections::HashSet<_> =
            (0..64).map(|k| slot_of(&format!("key-{k}"), 4)).collect();
        assert_eq!(spread.len(), 4);
        assert_eq!(slot_of("a", 4), slot_of("a", 4));
    }
}
