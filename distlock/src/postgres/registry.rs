//! Which advisory keys this locker holds, on which session, for which owner.
//!
//! Advisory locks are re-entrant within a session: a second
//! `pg_try_advisory_lock` of a key on the session that holds it succeeds.
//! Locks of many callers share a few sessions here, so the server cannot tell
//! them apart; this map does. A key is *reserved* before its attempt is sent
//! and stays reserved until the attempt's outcome is known, so two attempts
//! of one key never race on one session.
//!
//! Entries are keyed by the 64-bit advisory key, not the caller's string: two
//! strings that hash alike are one lock on the server, and so here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::session::Session;
use crate::{LostNotifier, LostReason};

#[derive(Debug, Default)]
pub(super) struct Registry {
    entries: Mutex<HashMap<i64, Entry>>,
    next_ticket: AtomicU64,
}

/// What this locker knows about one key. The two parts are independent: a
/// native wait (on a connection of its own) can be granted the key while an
/// attempt on the shared session is in flight, and release it again before
/// that attempt reaches the server, which may then grant it too. The
/// reservation must outlive all of that, or a second attempt could join the
/// first on the shared session and be granted the key re-entrantly.
#[derive(Debug, Default)]
struct Entry {
    /// The ticket of the attempt in flight (or being cleaned up).
    attempt: Option<u64>,
    held: Option<Held>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.attempt.is_none() && self.held.is_none()
    }
}

/// A lock this locker holds.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) owner: String,
    pub(super) session: Arc<Session>,
    pub(super) lost: LostNotifier,
}

/// A reservation of one key: proof that no other attempt of this locker is
/// in flight for it. Ended explicitly: see [`Registry::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ticket {
    pub(super) key: i64,
    id: u64,
}

/// Why a granted lock could not be recorded.
#[derive(Debug)]
pub(super) struct SessionClosed;

impl Registry {
    fn entries(&self) -> MutexGuard<'_, HashMap<i64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves `key` for one attempt, or `None` if this locker already holds
    /// it or has an attempt in flight (contention, answered locally).
    pub(super) fn reserve(&self, key: i64) -> Option<Ticket> {
        let mut entries = self.entries();
        let entry = entries.entry(key).or_default();
        if !entry.is_empty() {
            return None;
        }
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        entry.attempt = Some(id);
        Some(Ticket { key, id })
    }

    /// Ends a reservation, once its attempt's outcome is recorded (or its
    /// cleanup is done).
    pub(super) fn release(&self, ticket: Ticket) {
        self.update(ticket.key, |entry| {
            if entry.attempt == Some(ticket.id) {
                entry.attempt = None;
            }
        });
    }

    /// Records a granted lock. A reservation of the key stays in place.
    ///
    /// The server granted `key` to `held.session`, so no other session holds
    /// it: a lock still recorded here is on a session that died without its
    /// death being processed yet. That lease is lost, and is told so now.
    ///
    /// Fails if the session has died since: its death was (or is being)
    /// processed without this entry, so recording it would leave a lease that
    /// never learns its lock is gone.
    pub(super) fn grant(&self, key: i64, held: Held) -> Result<(), SessionClosed> {
        let displaced = {
            let mut entries = self.entries();
            if held.session.is_closed() {
                return Err(SessionClosed);
            }
            entries.entry(key).or_default().held.replace(held)
        };
        if let Some(stale) = displaced {
            tracing::warn!(
                component = "distlock",
                backend = "postgres",
                advisory_key = key,
                "a lock was granted while this locker still recorded it as held on another session; that lease is lost"
            );
            // Outside the map's lock: firing a lost signal may run callbacks.
            stale.lost.notify(LostReason::ConnectionLost);
        }
        Ok(())
    }

    /// Removes and returns the lock on `key` if `owner` holds it here.
    pub(super) fn take(&self, key: i64, owner: &str) -> Option<Held> {
        let mut taken = None;
        self.update(key, |entry| {
            if entry.held.as_ref().is_some_and(|held| held.owner == owner) {
                taken = entry.held.take();
            }
        });
        taken
    }

    /// The session holding `key` for `owner`, if this locker holds it.
    pub(super) fn session_of(&self, key: i64, owner: &str) -> Option<Arc<Session>> {
        let entries = self.entries();
        let held = entries.get(&key)?.held.as_ref()?;
        (held.owner == owner).then(|| held.session.clone())
    }

    /// True if this locker holds `key` or has an attempt in flight for it.
    pub(super) fn is_busy(&self, key: i64) -> bool {
        self.entries().contains_key(&key)
    }

    /// Forgets every lock held on session `session_id`, which is gone, and
    /// fires their lost signals.
    pub(super) fn session_closed(&self, session_id: u64, why: &str) {
        let mut lost = Vec::new();
        self.entries().retain(|_, entry| {
            if entry
                .held
                .as_ref()
                .is_some_and(|held| held.session.id == session_id)
            {
                lost.extend(entry.held.take().map(|held| held.lost));
            }
            !entry.is_empty()
        });
        if !lost.is_empty() {
            tracing::warn!(
                component = "distlock",
                backend = "postgres",
                leases = lost.len(),
                why,
                "a session holding locks ended; the server has released them"
            );
        }
        // Fired outside the map's lock: a lost signal may run callbacks.
        for notifier in lost {
            notifier.notify(LostReason::ConnectionLost);
        }
    }

    /// Changes the entry of `key`, if any, and drops it once empty.
    fn update(&self, key: i64, change: impl FnOnce(&mut Entry)) {
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(&key) {
            change(entry);
            if entry.is_empty() {
                entries.remove(&key);
            }
        }
    }

    /// How many locks this locker holds.
    pub(super) fn held_count(&self) -> usize {
        self.entries()
            .values()
            .filter(|entry| entry.held.is_some())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use crate::postgres::PostgresLocker;
    use crate::{Lease, LeaseParts, Locker, LostReason};

    use super::*;

    fn lease_for(locker: &PostgresLocker) -> Lease {
        Lease::new(
            LeaseParts {
                key: "k".into(),
                owner: "waiter".into(),
                fencing_token: None,
                ttl: std::time::Duration::from_secs(1),
                valid_until: None,
            },
            Arc::new(locker.clone()) as Arc<dyn Locker>,
        )
    }

    /// The sequence that once let two attempts of one key share a session: an
    /// attempt is in flight when a native wait is granted the key and
    /// releases it. The attempt's reservation must survive both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_and_release_by_a_waiter_keep_an_attempts_reservation() {
        let server = test_servers::PostgresServer::start();
        let locker = PostgresLocker::connect(&server.url()).await.unwrap();
        let waiter_session = locker
            .inner
            .pool
            .waiter()
            .await
            .unwrap()
            .expect("a free permit");
        let registry = Registry::default();

        let attempt = registry.reserve(7).expect("free key");
        let lease = lease_for(&locker);
        let held = Held {
            owner: "waiter".into(),
            session: waiter_session.clone(),
            lost: lease.lost_notifier(),
        };
        registry.grant(7, held).unwrap();
        assert!(registry.reserve(7).is_none(), "held");
        assert!(registry.take(7, "waiter").is_some());
        assert!(
            registry.reserve(7).is_none(),
            "the first attempt is still in flight"
        );
        assert!(registry.is_busy(7));
        registry.release(attempt);
        assert!(!registry.is_busy(7), "an empty entry is dropped");
        assert!(registry.reserve(7).is_some());

        // A session's death loses its leases and forgets them.
        let lease = lease_for(&locker);
        let held = Held {
            owner: "waiter".into(),
            session: waiter_session.clone(),
            lost: lease.lost_notifier(),
        };
        registry.grant(8, held).unwrap();
        registry.session_closed(waiter_session.id, "test");
        assert_eq!(
            lease.lost_signal().reason(),
            Some(LostReason::ConnectionLost)
        );
        assert_eq!(registry.held_count(), 0);
    }
}
