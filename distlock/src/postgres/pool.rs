//! The connections of one locker: a fixed number of shared sessions, and
//! connections for native waits.
//!
//! This is deliberately not a general-purpose pool: a connection carrying a
//! lock is never handed to anyone else, never reset (deadpool's `Clean`
//! recycling runs `pg_advisory_unlock_all()`, its `Fast` recycling hands a
//! lock-holding connection to the next user; FIELD-NOTES), and never closed
//! while it carries a lock, except to give up every lock on it at once.
//!
//! - Shared sessions: `sessions` slots, opened lazily; a key always maps to
//!   the same slot (advisory key modulo the slot count), so every attempt on
//!   a key is ordered on one connection. They carry the locks taken without
//!   waiting, any number of them.
//! - Waiter connections: a native wait blocks its connection (tokio-postgres
//!   pipelines requests, so a waiting `pg_advisory_lock` on a shared session
//!   would stall every other lock on it). Each wait gets a connection of its
//!   own, which then carries the one lock it won until release; after that,
//!   up to `idle_waiters` are kept for the next wait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::config::Settings;
use super::fencing::Sql;
use super::session::{OnClosed, Role, Session};
use crate::Result;

pub(super) struct Pool {
    settings: Arc<Settings>,
    sql: Arc<Sql>,
    slots: Box<[tokio::sync::Mutex<Option<Arc<Session>>>]>,
    idle_waiters: Mutex<Vec<Arc<Session>>>,
    next_id: AtomicU64,
    on_closed: OnClosed,
    /// Set once the fencing table is known to exist.
    table_ready: AtomicBool,
}

impl Pool {
    pub(super) fn new(settings: Arc<Settings>, sql: Arc<Sql>, on_closed: OnClosed) -> Self {
        let slots = (0..settings.sessions)
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        Pool {
            settings,
            sql,
            slots,
            idle_waiters: Mutex::default(),
            next_id: AtomicU64::new(1),
            on_closed,
            table_ready: AtomicBool::new(false),
        }
    }

    /// The shared session for `key`, opened (or reopened, if it died) now if
    /// needed. Concurrent callers for one slot wait for one connect.
    pub(super) async fn shared(&self, key: i64) -> Result<Arc<Session>> {
        let slot = &self.slots[slot_of(key, self.slots.len())];
        let mut current = slot.lock().await;
        if let Some(session) = current.as_ref().filter(|s| !s.is_closed()) {
            return Ok(session.clone());
        }
        let session = self.open(Role::Shared).await?;
        *current = Some(session.clone());
        Ok(session)
    }

    /// A connection for a native wait: an idle one if any is alive, else a
    /// new one.
    pub(super) async fn waiter(&self) -> Result<Arc<Session>> {
        loop {
            let idle = self
                .idle_waiters
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match idle {
                Some(session) if !session.is_closed() => return Ok(session),
                Some(_dead) => continue,
                None => return self.open(Role::Waiter).await,
            }
        }
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

    async fn open(&self, role: Role) -> Result<Arc<Session>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ensure_table = match &self.settings.fencing {
            Some(table) if !self.table_ready.load(Ordering::Acquire) => Some(table),
            _ => None,
        };
        let session = Session::open(
            &self.settings,
            &self.sql,
            ensure_table,
            id,
            role,
            self.on_closed.clone(),
        )
        .await?;
        self.table_ready.store(true, Ordering::Release);
        Ok(session)
    }
}

/// The shared-session slot of an advisory key.
fn slot_of(key: i64, slots: usize) -> usize {
    // Keys are uniform (SHA-256) or chosen by the caller (raw keys, often
    // sequential); both spread evenly over the slots this way.
    (key as u64 % slots as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_maps_to_a_slot() {
        for key in [i64::MIN, -1, 0, 1, 7, i64::MAX] {
            assert!(slot_of(key, 4) < 4);
        }
        let spread: std::collections::HashSet<_> = (0..8).map(|k| slot_of(k, 4)).collect();
        assert_eq!(spread.len(), 4);
    }
}
