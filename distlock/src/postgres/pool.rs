//! The connections of one locker: a fixed number of shared sessions, and
//! connections for native waits.
//!
//! This is deliberately not a general-purpose pool: a connection carrying a
//! lock is never handed to anyone else, never reset (deadpool's `Clean`
//! recycling runs `pg_advisory_unlock_all()`, its `Fast` recycling hands a
//! lock-holding connection to the next user; see deadpool-postgres'
//! `RecyclingMethod` docs), and never closed
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
//! - At most `max_waiters` waiter connections exist at once, idle ones
//!   included: each holds a semaphore permit for as long as it is open
//!   (see [`Session`]). Without that cap, a burst of waits on held keys
//!   would open one connection each and could exhaust the server's
//!   `max_connections`. When no permit is left, [`Pool::waiter`] says so and
//!   the caller polls on the shared sessions instead.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::config::Settings;
use super::fencing::Sql;
use super::session::{OnClosed, Role, Session};
use crate::Result;

pub(super) struct Pool {
    settings: Arc<Settings>,
    sql: Arc<Sql>,
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
    pub(super) fn new(settings: Arc<Settings>, sql: Arc<Sql>, on_closed: OnClosed) -> Self {
        // `max_waiters` is within the semaphore's limit: checked when the
        // settings were built.
        let waiter_permits = Arc::new(Semaphore::new(settings.max_waiters));
        let slots = (0..settings.sessions)
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        Pool {
            settings,
            sql,
            slots,
            idle_waiters: Mutex::default(),
            waiter_permits,
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
            waiter_permit,
            self.on_closed.clone(),
        )
        .await?;
        self.table_ready.store(true, Ordering::Release);
        Ok(session)
    }
}

#[cfg(test)]
impl Pool {
    /// Waiter connections open and not idle: waiting, or carrying a lock.
    pub(super) fn waiters_in_use(&self) -> usize {
        let idle = self
            .idle_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        (self.settings.max_waiters - self.waiter_permits.available_permits()).saturating_sub(idle)
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
    use crate::postgres::PostgresLocker;

    /// Idle waiter connections count toward `max_waiters` (so the bound is
    /// `sessions + max_waiters` in all), are reused before a new one is
    /// opened, and give their permit back once they die.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_waiters_count_toward_max_waiters() {
        let server = test_servers::PostgresServer::start();
        let url = format!("{}&max_waiters=2&idle_waiters=5", server.url());
        let locker = PostgresLocker::from_url(&url).await.unwrap();
        let pool = &locker.inner.pool;
        let idle_count = || pool.idle_waiters.lock().unwrap().len();

        let (a, b) = (
            pool.waiter().await.unwrap().expect("a permit"),
            pool.waiter().await.unwrap().expect("a permit"),
        );
        assert!(pool.waiter().await.unwrap().is_none(), "two are open");
        let (a_id, b_id) = (a.id, b.id);
        pool.recycle(a);
        pool.recycle(b);
        assert_eq!((idle_count(), pool.waiters_in_use()), (2, 0));
        assert_eq!(
            pool.waiter_permits.available_permits(),
            0,
            "idle ones hold theirs"
        );

        // Reused, not opened anew.
        let reused = pool.waiter().await.unwrap().expect("an idle one");
        assert!([a_id, b_id].contains(&reused.id));
        assert_eq!((idle_count(), pool.waiters_in_use()), (1, 1));

        // An idle connection that died gives its permit back to the next
        // checkout, which opens a fresh one.
        let pid: i32 = {
            let idle = pool.idle_waiters.lock().unwrap()[0].clone();
            idle.query("SELECT pg_backend_pid()", &[]).await.unwrap()[0].get(0)
        };
        server.psql(&format!("SELECT pg_terminate_backend({pid}, 5000)"));
        let started = tokio::time::Instant::now();
        while !pool.idle_waiters.lock().unwrap()[0].is_closed() {
            assert!(started.elapsed() < std::time::Duration::from_secs(5));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let fresh = pool.waiter().await.unwrap().expect("the dead one's permit");
        assert!(![a_id, b_id].contains(&fresh.id), "a new connection");
        assert_eq!((idle_count(), pool.waiters_in_use()), (0, 2));
        assert!(pool.waiter().await.unwrap().is_none());
        drop((reused, fresh));
        assert_eq!(pool.waiter_permits.available_permits(), 2);
    }

    #[test]
    fn every_key_maps_to_a_slot() {
        for key in [i64::MIN, -1, 0, 1, 7, i64::MAX] {
            assert!(slot_of(key, 4) < 4);
        }
        let spread: std::collections::HashSet<_> = (0..8).map(|k| slot_of(k, 4)).collect();
        assert_eq!(spread.len(), 4);
    }
}
