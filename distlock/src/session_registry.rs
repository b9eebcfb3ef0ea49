//! Which keys a locker holds, on which server session, for which owner: the
//! machinery every backend needs whose server locks belong to a *session*
//! and are re-entrant within it (Postgres advisory locks; MySQL/MariaDB
//! `GET_LOCK` from 5.7/10.0.2 on), written once, as the .NET DistributedLock
//! library keeps its multiplexed-session core apart from each SQL backend.
//!
//! A second lock of a key on the session that holds it succeeds on such a
//! server. Locks of many callers share a few sessions, so the server cannot
//! tell them apart; this map does. A key is *reserved* before its attempt is
//! sent and stays reserved until the attempt's outcome is known, so two
//! attempts of one key never race on one session.
//!
//! Entries are keyed by what the server locks (Postgres: the 64-bit advisory
//! key, not the caller's string: two strings that hash alike are one lock on
//! the server, and so here).
//!
//! # Invariants
//!
//! - **Who owns a reservation.** [`Registry::reserve`] hands out one
//!   [`Ticket`] per key at a time, and only the attempt on the key's shared
//!   session that got it (Postgres: the `Attempt` guard in
//!   `postgres/acquire.rs`) may end it. A Postgres `try_lock_any` reserves
//!   every key it sends, all before its one statement, which runs on the
//!   first key's shared session: its one guard holds and ends them all.
//!   Nothing else clears `Entry::attempt`: not a grant, not a release, not a
//!   session's death.
//! - **When a ticket ends.** Once the attempt's outcome is recorded (granted
//!   and entered as `held`, or refused), or, for an attempt abandoned after
//!   its statement may have reached the server, once its cleanup
//!   (an unlock-if-held behind it on the same session, or closing that
//!   session) is done. Between abandonment and the end of the cleanup the
//!   reservation is marked [`Reservation::CleaningUp`]: the server may hold
//!   the key for nobody, so this locker cannot say whether it is free or
//!   held elsewhere, and says so (an error) instead of answering
//!   "contention" or "not held" ([`Registry::state`]).
//! - **Why native waits skip reservation.** A native wait runs on a
//!   connection of its own, so its server-side wait is never re-entrant
//!   with a hold on a shared session: the server orders it against every
//!   other session, this locker's included, and grants it only once the key
//!   is free there. Only its grant is recorded (`held`), beside whatever
//!   reservation an attempt on the shared session has.
//! - **Shared (reader) holds.** A key is held either by one exclusive
//!   holder or by any number of readers, each a lease of its own (owner
//!   token, session, lost signal). The server holds a key shared **once per
//!   session**, however many readers of this locker are on that session:
//!   the first reader's attempt takes it (reserved like any attempt, so an
//!   abandoned one is cleaned up exactly), later readers on the same session
//!   *join* that hold without a server lock of their own
//!   ([`Registry::reserve_shared`], [`Registry::join`]), and only the last
//!   reader on a session to leave releases it there
//!   ([`Hold::Shared`]`{ last_on_session }`). One hold per session, not one
//!   per reader, because the server counts re-entrant holds but cannot say
//!   how many a session has: an abandoned attempt's cleanup could not tell
//!   whether its own hold is among them. An exclusive attempt is refused
//!   while this locker has a reader of the key (a server would grant it
//!   re-entrantly on the reader's session), and a reader while it holds the
//!   key exclusively.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use std::fmt;
use std::future::Future;
use std::hash::Hash;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use crate::{Error, LostNotifier, LostReason};

/// What the registry needs to know of a server session.
pub(crate) trait HoldingSession: Send + Sync {
    /// Unique among the sessions of one locker.
    fn id(&self) -> u64;
    /// True once the connection is gone: nothing it held is held.
    fn is_closed(&self) -> bool;
}

/// The locks of one locker: `K` the key the server locks, `S` its sessions.
pub(crate) struct Registry<K, S> {
    /// Backend name, for logs.
    backend: &'static str,
    entries: Mutex<HashMap<K, Entry<S>>>,
    next_ticket: AtomicU64,
    /// Notified whenever a reservation ends ([`Registry::release`]): a
    /// reader waiting for an attempt in flight ([`ForReader::Settling`])
    /// asks again then.
    settled: Notify,
}

impl<K, S> fmt::Debug for Registry<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// What this locker knows about one key. The two parts are independent: a
/// native wait (on a connection of its own) can be granted the key while an
/// attempt on the shared session is in flight, and release it again before
/// that attempt reaches the server, which may then grant it too. The
/// reservation must outlive all of that, or a second attempt could join the
/// first on the shared session and be granted the key re-entrantly.
struct Entry<S> {
    /// The ticket of the attempt in flight (or being cleaned up).
    attempt: Option<(u64, Reservation)>,
    /// The exclusive hold, if any.
    held: Option<Held<S>>,
    /// The shared holds, one per reader (never beside `held`).
    readers: Vec<Reader<S>>,
}

impl<S> Default for Entry<S> {
    fn default() -> Self {
        Entry {
            attempt: None,
            held: None,
            readers: Vec::new(),
        }
    }
}

impl<S: HoldingSession> Entry<S> {
    fn is_empty(&self) -> bool {
        self.attempt.is_none() && self.held.is_none() && self.readers.is_empty()
    }

    /// A hold wins over a pending cleanup: the key is then held here (the
    /// server granted it to that session alone, so the abandoned attempt
    /// cannot hold it too), and "contention" is the truth. Readers are a
    /// hold too: an exclusive attempt is refused beside them.
    fn busy(&self) -> Option<Busy> {
        if self.held.is_some() || !self.readers.is_empty() {
            return Some(Busy::Contended);
        }
        match self.attempt {
            Some((_, Reservation::InFlight)) => Some(Busy::Contended),
            Some((_, Reservation::CleaningUp)) => Some(Busy::CleaningUp),
            None => None,
        }
    }

    /// A live reader on session `session_id`, if any: the session holds
    /// the key shared.
    fn reader_on(&self, session_id: u64) -> Option<&Reader<S>> {
        self.readers
            .iter()
            .find(|r| r.held.session.id() == session_id && !r.held.session.is_closed())
    }

    /// Removes `owner`'s hold, exclusive or shared, saying which.
    fn take_hold(&mut self, owner: &str) -> Option<(Held<S>, Hold)> {
        if self.held.as_ref().is_some_and(|held| held.owner == owner) {
            return self.held.take().map(|held| (held, Hold::Exclusive));
        }
        let index = self.readers.iter().position(|r| r.held.owner == owner)?;
        let reader = self.readers.swap_remove(index);
        let session_id = reader.held.session.id();
        let last_on_session = self
            .readers
            .iter()
            .all(|r| r.held.session.id() != session_id);
        Some((reader.held, Hold::Shared { last_on_session }))
    }
}

/// A lock this locker holds.
pub(crate) struct Held<S> {
    pub(crate) owner: String,
    pub(crate) session: Arc<S>,
    pub(crate) lost: LostNotifier,
}

/// A shared hold this locker has: the reader's lease, and the fencing token
/// it carries (the key's counter when its session took the key shared;
/// unchanged while the session holds it, since no writer can be granted
/// meanwhile), which a reader joining the same session's hold carries too.
pub(crate) struct Reader<S> {
    pub(crate) held: Held<S>,
    pub(crate) fencing_token: Option<u64>,
}

/// What kind of hold [`Registry::take_hold`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// The exclusive hold: the server lock is to be released.
    Exclusive,
    /// A reader's. Only when it was the last reader on its session is the
    /// server's shared lock (one per session) to be released; otherwise the
    /// readers left on that session still need it.
    Shared { last_on_session: bool },
}

/// How a reader of a key may proceed ([`Registry::reserve_shared`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ForReader<K> {
    /// The session already holds the key shared for a reader of this
    /// locker: a new reader joins that hold ([`Registry::join`]), carrying
    /// its fencing token. No server lock is taken for it.
    Join { fencing_token: Option<u64> },
    /// Nobody here holds it shared on that session: one attempt, reserved.
    Attempt(Ticket<K>),
    /// Another attempt of this locker on the key is in flight: its outcome
    /// decides (a reader may then join it); ask again once it settles
    /// ([`Registry::settled`]).
    Settling,
}

/// A reservation of one key: proof that no other attempt of this locker is
/// in flight for it. Ended explicitly: see [`Registry::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket<K> {
    pub(crate) key: K,
    id: u64,
}

/// What a reservation's attempt is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reservation {
    /// Sent, or about to be; its caller is waiting for the answer.
    InFlight,
    /// Abandoned after it may have reached the server; its cleanup (release
    /// if taken, or close the session) is not done yet.
    CleaningUp,
}

/// Why a key cannot be reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// This locker holds the key, or another caller's attempt is in flight:
    /// contention, as from any other client.
    Contended,
    /// An abandoned attempt's cleanup is pending: whether the key is held
    /// (and by whom) is unknown until it ends.
    CleaningUp,
}

/// One lock a keepalive batch confirms ([`Registry::confirm_many`]): what
/// the server locks, the owner token, and the key as the caller named it
/// (for [`Error::NotHeld`]).
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) struct Claim<'a, K> {
    pub(crate) id: K,
    pub(crate) owner: &'a str,
    pub(crate) key: &'a str,
}

/// A claim [`Registry::confirm_many`] asks a session about, with its index
/// in the batch.
type Asked<'a, K> = (usize, Claim<'a, K>);

/// Why a granted lock could not be recorded.
#[derive(Debug)]
pub(crate) struct SessionClosed;

impl<K, S> Registry<K, S>
where
    K: Clone + Hash + Eq + fmt::Debug,
    S: HoldingSession,
{
    /// An empty registry; `backend` names it in logs.
    pub(crate) fn new(backend: &'static str) -> Self {
        Registry {
            backend,
            entries: Mutex::default(),
            next_ticket: AtomicU64::new(0),
            settled: Notify::new(),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<K, Entry<S>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves `key` for one attempt, or says why not: this locker holds it
    /// or another attempt is in flight ([`Busy::Contended`], answered
    /// locally), or an abandoned attempt is still being cleaned up
    /// ([`Busy::CleaningUp`]).
    pub(crate) fn reserve(&self, key: K) -> Result<Ticket<K>, Busy> {
        let mut entries = self.entries();
        let entry = entries.entry(key.clone()).or_default();
        if let Some(busy) = entry.busy() {
            return Err(busy);
        }
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        entry.attempt = Some((id, Reservation::InFlight));
        Ok(Ticket { key, id })
    }

    /// How a reader of `key` on session `session_id` (the key's shared
    /// session) may proceed: join the shared hold a reader of this locker
    /// has there, make the one attempt (reserved as [`reserve`](Self::reserve)
    /// reserves), or wait for an attempt in flight to settle. Refused
    /// ([`Busy::Contended`]) while this locker holds the key exclusively,
    /// and ([`Busy::CleaningUp`]) while an abandoned attempt is cleaned up.
    pub(crate) fn reserve_shared(&self, key: K, session_id: u64) -> Result<ForReader<K>, Busy> {
        let mut entries = self.entries();
        let entry = entries.entry(key.clone()).or_default();
        if entry.held.is_some() {
            return Err(Busy::Contended);
        }
        match entry.attempt {
            Some((_, Reservation::InFlight)) => return Ok(ForReader::Settling),
            Some((_, Reservation::CleaningUp)) => return Err(Busy::CleaningUp),
            None => {}
        }
        if let Some(reader) = entry.reader_on(session_id) {
            return Ok(ForReader::Join {
                fencing_token: reader.fencing_token,
            });
        }
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        entry.attempt = Some((id, Reservation::InFlight));
        Ok(ForReader::Attempt(Ticket { key, id }))
    }

    /// Records `reader` as joining the shared hold of `key` on its session,
    /// if a live reader of this locker still holds it there (else `false`:
    /// the last one left meanwhile, and the server lock with it; make an
    /// attempt instead).
    pub(crate) fn join(&self, key: &K, reader: Reader<S>) -> bool {
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(key) else {
            return false;
        };
        if entry.held.is_some() || entry.reader_on(reader.held.session.id()).is_none() {
            return false;
        }
        entry.readers.push(reader);
        true
    }

    /// Resolves once a reservation of any key ends: enable it, then ask
    /// [`reserve_shared`](Self::reserve_shared) again, so that a reservation
    /// ending in between is not missed.
    pub(crate) fn settled(&self) -> Notified<'_> {
        self.settled.notified()
    }

    /// Marks `ticket`'s attempt abandoned: its reservation stays until
    /// [`release`](Self::release), after the cleanup.
    pub(crate) fn cleaning_up(&self, ticket: Ticket<K>) {
        self.update(&ticket.key, |entry| {
            if let Some((id, state)) = entry.attempt.as_mut() {
                if *id == ticket.id {
                    *state = Reservation::CleaningUp;
                }
            }
        });
    }

    /// Ends a reservation, once its attempt's outcome is recorded (or its
    /// cleanup is done).
    pub(crate) fn release(&self, ticket: Ticket<K>) {
        self.update(&ticket.key, |entry| {
            if entry.attempt.is_some_and(|(id, _)| id == ticket.id) {
                entry.attempt = None;
            }
        });
        self.settled.notify_waiters();
    }

    /// Why `key` cannot be reserved right now, if it cannot.
    pub(crate) fn state(&self, key: &K) -> Option<Busy> {
        self.entries().get(key).and_then(Entry::busy)
    }

    /// True if `key` is busy here only because another attempt of this
    /// locker on it is in flight (nothing here holds it): its outcome is
    /// not known yet, so the key may well be free once it settles
    /// ([`settled`](Self::settled)).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn only_in_flight(&self, key: &K) -> bool {
        self.entries().get(key).is_some_and(|entry| {
            entry.held.is_none()
                && entry.readers.is_empty()
                && matches!(entry.attempt, Some((_, Reservation::InFlight)))
        })
    }

    /// Records a granted lock. A reservation of the key stays in place.
    ///
    /// The server granted `key` to `held.session`, so no other session holds
    /// it: a lock still recorded here (exclusive or shared) is on a session
    /// that died without its death being processed yet. That lease is lost,
    /// and is told so now.
    ///
    /// Fails if the session has died since: its death was (or is being)
    /// processed without this entry, so recording it would leave a lease that
    /// never learns its lock is gone.
    pub(crate) fn grant(&self, key: K, held: Held<S>) -> Result<(), SessionClosed> {
        let displaced = {
            let mut entries = self.entries();
            if held.session.is_closed() {
                return Err(SessionClosed);
            }
            let entry = entries.entry(key.clone()).or_default();
            let mut stale: Vec<Held<S>> = entry.readers.drain(..).map(|r| r.held).collect();
            stale.extend(entry.held.replace(held));
            stale
        };
        self.lose_displaced(&key, displaced);
        Ok(())
    }

    /// Records a granted shared hold of `key` (one attempt's or one native
    /// wait's; a reader joining a hold is [`join`](Self::join)). A
    /// reservation of the key stays in place.
    ///
    /// The server granted it shared to `reader`'s session, so no session
    /// holds it exclusively: an exclusive hold still recorded here is on a
    /// dead session, and its lease is told so now. Fails as
    /// [`grant`](Self::grant) does.
    pub(crate) fn grant_shared(&self, key: K, reader: Reader<S>) -> Result<(), SessionClosed> {
        let displaced = {
            let mut entries = self.entries();
            if reader.held.session.is_closed() {
                return Err(SessionClosed);
            }
            let entry = entries.entry(key.clone()).or_default();
            entry.readers.push(reader);
            entry.held.take()
        };
        self.lose_displaced(&key, displaced.into_iter().collect());
        Ok(())
    }

    /// Tells the leases of holds a grant showed to be stale that they are
    /// lost, outside the map's lock (a lost signal may run callbacks).
    fn lose_displaced(&self, key: &K, displaced: Vec<Held<S>>) {
        if displaced.is_empty() {
            return;
        }
        tracing::warn!(
            component = "distlock",
            backend = self.backend,
            server_key = ?key,
            leases = displaced.len(),
            "a lock was granted while this locker still recorded a conflicting hold of it on another session; that lease is lost"
        );
        for stale in displaced {
            stale.lost.notify(LostReason::ConnectionLost);
        }
    }

    /// Removes and returns the lock on `key` if `owner` holds it here,
    /// exclusive or shared.
    pub(crate) fn take(&self, key: &K, owner: &str) -> Option<Held<S>> {
        self.take_hold(key, owner).map(|(held, _)| held)
    }

    /// [`take`](Self::take), saying what kind of hold it was and, for a
    /// reader, whether it was the last on its session (so the server lock
    /// is to be released: see [`Hold`]).
    pub(crate) fn take_hold(&self, key: &K, owner: &str) -> Option<(Held<S>, Hold)> {
        let mut taken = None;
        self.update(key, |entry| taken = entry.take_hold(owner));
        taken
    }

    /// Ends `owner`'s hold of `key` whose release has not reached the
    /// server yet, and keeps the key reserved as an abandoned attempt's is
    /// ([`Busy::CleaningUp`]) until the returned ticket is
    /// [released](Self::release), once the release retried in the
    /// background is done. Until then another attempt through this locker
    /// is told the truth, that nobody knows whether the key is free, rather
    /// than "contention" read from this stale hold. `None` if `owner` does
    /// not hold `key` here; the ticket is `None` if an attempt of the key
    /// is already in flight (its own outcome then decides).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn release_pending(
        &self,
        key: K,
        owner: &str,
    ) -> Option<(Held<S>, Option<Ticket<K>>)> {
        let mut entries = self.entries();
        let entry = entries.get_mut(&key)?;
        if entry.held.as_ref().is_none_or(|held| held.owner != owner) {
            return None;
        }
        let held = entry.held.take()?;
        if entry.attempt.is_some() {
            return Some((held, None));
        }
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        entry.attempt = Some((id, Reservation::CleaningUp));
        Some((held, Some(Ticket { key, id })))
    }

    /// The session holding `key` for `owner` (exclusive or shared), if this
    /// locker holds it.
    pub(crate) fn session_of(&self, key: &K, owner: &str) -> Option<Arc<S>> {
        let entries = self.entries();
        let entry = entries.get(key)?;
        let held = entry
            .held
            .iter()
            .chain(entry.readers.iter().map(|r| &r.held))
            .find(|held| held.owner == owner)?;
        Some(held.session.clone())
    }

    /// The keepalive batch ([`Locker::refresh_many`](crate::Locker::refresh_many))
    /// of a backend whose locks belong to sessions: each claim answers as a
    /// refresh would, in order. An `Err` claim (an invalid request) is its
    /// own answer; a claim this locker does not hold for that owner is
    /// [`Error::NotHeld`] without asking; the others are asked about on the
    /// session holding them, `per_call` at a time, every call at once.
    /// `confirm(session, ids)` sends one call and answers, in order,
    /// whether the session still holds each id. A lock the server no longer
    /// holds is forgotten here and its lease is told ([`LostReason::NotHeld`]);
    /// a failed call fails the claims it carried.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) async fn confirm_many<'a, F, Fut>(
        &self,
        claims: Vec<crate::Result<Claim<'a, K>>>,
        per_call: usize,
        confirm: F,
    ) -> Vec<crate::Result<()>>
    where
        F: Fn(Arc<S>, &[&K]) -> Fut,
        Fut: Future<Output = crate::Result<Vec<bool>>>,
    {
        let not_held = |key: &str| Error::NotHeld {
            key: key.to_owned(),
        };
        let mut results: Vec<Option<crate::Result<()>>> = Vec::with_capacity(claims.len());
        // The claims to ask about, by the session that holds them.
        let mut by_session: HashMap<u64, (Arc<S>, Vec<Asked<'a, K>>)> = HashMap::new();
        for (index, claim) in claims.into_iter().enumerate() {
            let claim = match claim {
                Ok(claim) => claim,
                Err(answer) => {
                    results.push(Some(Err(answer)));
                    continue;
                }
            };
            match self.session_of(&claim.id, claim.owner) {
                Some(session) => {
                    by_session
                        .entry(session.id())
                        .or_insert_with(|| (session, Vec::new()))
                        .1
                        .push((index, claim));
                    results.push(None);
                }
                None => results.push(Some(Err(not_held(claim.key)))),
            }
        }
        let calls: Vec<(&Arc<S>, &[Asked<'a, K>])> = by_session
            .values()
            .flat_map(|(session, asked)| {
                asked
                    .chunks(per_call.max(1))
                    .map(move |chunk| (session, chunk))
            })
            .collect();
        let answers = futures_util::future::join_all(calls.iter().map(|(session, chunk)| {
            let ids: Vec<&K> = chunk.iter().map(|(_, claim)| &claim.id).collect();
            confirm(Arc::clone(session), &ids)
        }))
        .await;
        for ((_, chunk), answer) in calls.iter().zip(answers) {
            match answer {
                Ok(held) => {
                    for ((index, claim), still_held) in chunk.iter().zip(held) {
                        results[*index] = Some(if still_held {
                            Ok(())
                        } else {
                            if let Some(gone) = self.take(&claim.id, claim.owner) {
                                gone.lost.notify(LostReason::NotHeld);
                            }
                            Err(not_held(claim.key))
                        });
                    }
                }
                Err(error) => {
                    for (index, _) in chunk.iter() {
                        results[*index] = Some(Err(error.duplicate()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(Error::backend(
                        self.backend,
                        "refresh",
                        "no answer for a lock",
                    ))
                })
            })
            .collect()
    }

    /// Forgets every lock held on session `session_id`, which is gone, and
    /// fires their lost signals, each with `grace`: how long the server may
    /// still hold those locks (Postgres: what is left of `Settings::server_window`).
    pub(crate) fn session_closed(&self, session_id: u64, why: &str, grace: Duration) {
        let mut lost = Vec::new();
        self.entries().retain(|_, entry| {
            if entry
                .held
                .as_ref()
                .is_some_and(|held| held.session.id() == session_id)
            {
                lost.extend(entry.held.take().map(|held| held.lost));
            }
            entry.readers.retain(|reader| {
                let on_it = reader.held.session.id() == session_id;
                if on_it {
                    lost.push(reader.held.lost.clone());
                }
                !on_it
            });
            !entry.is_empty()
        });
        // Fired outside the map's lock: a lost signal may run callbacks.
        LostNotifier::session_ended(
            lost,
            self.backend,
            None,
            why,
            grace,
            "a session holding locks ended; the server has released them, or will within the grace",
        );
    }

    /// Changes the entry of `key`, if any, and drops it once empty.
    fn update(&self, key: &K, change: impl FnOnce(&mut Entry<S>)) {
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(key) {
            change(entry);
            if entry.is_empty() {
                entries.remove(key);
            }
        }
    }

    /// How many locks this locker holds (each reader of a key counts).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn held_count(&self) -> usize {
        self.entries()
            .values()
            .map(|entry| usize::from(entry.held.is_some()) + entry.readers.len())
            .sum()
    }
}

#[cfg(test)]
mod tests;
