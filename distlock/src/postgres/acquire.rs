//! Taking a lock: one attempt on the key's shared session, or a native wait
//! on a connection of its own, or, when `max_waiters` such connections are
//! already open, polling on the shared session.
//!
//! Both are cancel-safe. An attempt whose answer never arrives (the caller
//! dropped the future, the server was too slow, the statement failed after
//! the lock was taken) may still hold the lock on the server, where nobody
//! would ever release it. sqlx's `PgAdvisoryLock::try_acquire` has exactly
//! this hole (its docs say it is not cancel-safe:
//! <https://docs.rs/sqlx/latest/sqlx/postgres/struct.PgAdvisoryLock.html>).
//! Here a guard notices, and releases the lock if it was taken — on the same
//! connection, behind the attempt, so the server runs the two in order — or
//! closes the connection when that is the only way to be sure.
//! (The guards are in [`cleanup`](super::cleanup).)
//!
//! That is also what makes the whole of [`Locker::lock`] safe to bound by
//! its caller's deadline: whatever step is abandoned (the attempt on the
//! shared session, opening a waiter connection, the wait, the check after a
//! lock timeout), its guard undoes what the server may have done.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::cleanup::Attempt;
use super::errors::{self, BACKEND};
use super::fencing::GrantRecord;
use super::keys::LockKey;
use super::pool::Ticket;
use super::session::Session;
use super::Inner;
use crate::deadline::saturating_deadline;
use crate::session_registry::Busy;
use crate::sql::core::Tried;
use crate::sql::fencing::owner_digest;
use crate::{new_owner_token, Error, Lease, Locker, Result};

/// The longest `lock_timeout` Postgres accepts (its maximum, `INT_MAX` ms,
/// about 24.8 days). Longer waits are several consecutive waits.
const MAX_LOCK_TIMEOUT_MS: u128 = i32::MAX as u128;

impl Inner {
    /// After `lock_timeout` fired: was the lock granted anyway? Postgres can
    /// grant it as the timeout fires, and then reports the timeout with the
    /// lock held (checked here; the wait and the timeout race in
    /// `ProcSleep`, postgres `src/backend/storage/lmgr/proc.c`). A lock
    /// granted that way is kept: its counter is bumped now (the statement
    /// that would have done it was aborted) and the caller gets it, a hair
    /// late, rather than a `Timeout` that leaves it stranded.
    pub(super) async fn granted_anyway(
        &self,
        session: &Session,
        lock: LockKey<'_>,
        digest: &str,
        record: &GrantRecord<'_>,
    ) -> Result<Option<Option<i64>>> {
        let query_timeout = self.settings.query_timeout;
        let context = || {
            format!(
                "check {:?} after its lock timeout on {}",
                lock.key, self.settings.target
            )
        };
        if !errors::within("acquire", query_timeout, context, session.holds(lock.id)).await? {
            return Ok(None);
        }
        tracing::debug!(
            component = "distlock",
            backend = BACKEND,
            key = lock.key,
            "lock granted as its lock timeout fired; keeping it"
        );
        let token = session.grant_token(lock.id, digest, record);
        errors::within("acquire", query_timeout, context, token)
            .await
            .map(Some)
    }

    /// Turns a grant on `session` into a lease and records it: the
    /// holder's, or with `shared` a reader's (`token` is then the key's
    /// counter as read after the grant).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_grant(
        &self,
        lock: LockKey<'_>,
        ttl: Duration,
        owner: String,
        token: Option<i64>,
        session: Arc<Session>,
        lease_locker: Arc<dyn Locker>,
        shared: bool,
    ) -> Result<Lease> {
        let fencing_token = fencing_token(lock, token)?;
        let core = &self.core;
        core.grant(
            lock.id,
            lock.key,
            ttl,
            owner,
            fencing_token,
            session,
            lease_locker,
            shared,
        )
    }
}

impl Inner {
    /// [`Locker::try_lock_any`] as one statement ([`Sql::try_lock_any`](super::fencing::Sql)),
    /// which takes at most one key, the first free one in the order given,
    /// bumping its counter and writing its record as a `try_lock` would.
    ///
    /// The keys are reserved in the registry first, all at once, as
    /// `try_lock` reserves its key: a key this locker holds (exclusively or
    /// shared, on any of its sessions) or is trying is not sent at all, so
    /// the statement can never be granted a key re-entrantly over a hold of
    /// this locker. The statement runs on the shared session of the first
    /// key sent, which then carries the key it took whatever that key's own
    /// session would be (as a waiter connection carries the key it won);
    /// starting from a random key, as a semaphore does, spreads the holds
    /// over the sessions. A guard releases whichever key the statement took
    /// if its answer never arrives ([`Attempt`]).
    ///
    /// Keys another caller of this locker is trying at the same moment (its
    /// own `try_lock_any` over the same permits, most likely) are not known
    /// to be held: when nothing else was granted, this attempt waits for
    /// those to settle and tries them again (a statement each time, at most
    /// `query_timeout` in all), so that `None` always means "every key was
    /// held", never "another caller of this locker was trying them". Keys
    /// this locker holds are contention at once, as for `try_lock`.
    ///
    /// A key whose abandoned attempt is still being cleaned up is left out:
    /// if no other key is granted, the answer is that key's
    /// [`Error::Backend`] ("still being cleaned up"), as `try_lock` on it
    /// would answer, rather than `None`, which it may not be.
    pub(super) async fn attempt_any(
        &self,
        locks: &[LockKey<'_>],
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Option<Lease>> {
        let registry = &self.core.registry;
        let give_up_at = saturating_deadline(Instant::now(), self.settings.query_timeout);
        let mut to_try = locks.to_vec();
        let mut cleaning_up = None;
        loop {
            let settled = registry.settled();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let round = self
                .attempt_any_once(&to_try, ttl, lease_locker.clone())
                .await?;
            let in_flight = match round {
                AnyRound::Granted(lease) => return Ok(Some(lease)),
                AnyRound::NoneFree {
                    in_flight,
                    cleaning_up: cleaning,
                } => {
                    cleaning_up = cleaning_up.or(cleaning);
                    in_flight
                }
            };
            // Every key was held (or, while still in flight, is past the
            // bound below: contention, as for a reader in `try_once_shared`).
            if in_flight.is_empty() || tokio::time::timeout_at(give_up_at, settled).await.is_err() {
                return match cleaning_up {
                    Some(key) => Err(self.core.cleanup_pending(key, "acquire")),
                    None => Ok(None),
                };
            }
            to_try = in_flight;
        }
    }

    /// One round of [`attempt_any`](Self::attempt_any): the keys that can
    /// be reserved now, in one statement.
    async fn attempt_any_once<'k>(
        &self,
        locks: &[LockKey<'k>],
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<AnyRound<'k>> {
        let registry = &self.core.registry;
        let mut attempt = Attempt {
            registry: registry.clone(),
            tickets: Vec::with_capacity(locks.len()),
            sent_on: None,
            query_timeout: self.settings.query_timeout,
            shared: false,
        };
        // No await until every key is reserved (or refused).
        let mut sent = Vec::with_capacity(locks.len());
        let (mut in_flight, mut cleaning_up) = (Vec::new(), None);
        for &lock in locks {
            match registry.reserve(lock.id) {
                Ok(ticket) => {
                    attempt.tickets.push(ticket);
                    sent.push(lock);
                }
                // Tried by another caller right now: not known to be held.
                Err(Busy::Contended) if registry.only_in_flight(&lock.id) => {
                    in_flight.push(lock);
                }
                // Held here (or named twice, and so reserved just above).
                Err(Busy::Contended) => {}
                Err(Busy::CleaningUp) => {
                    cleaning_up.get_or_insert(lock.key);
                }
            }
        }
        // A key named twice is reserved by this round itself, not in flight
        // elsewhere.
        in_flight.retain(|lock| !sent.iter().any(|s| s.id == lock.id));
        let none_free = AnyRound::NoneFree {
            in_flight,
            cleaning_up,
        };
        let Some(&first) = sent.first() else {
            return Ok(none_free);
        };
        // Read on the caller's task, where its label scope is.
        let record = GrantRecord::new(first.key, ttl, self.settings.holder_record);
        let session = self.core.pool.shared(&first.id).await?;
        let owner = new_owner_token();
        let fencing = self.sql.fencing();
        // Only the fencing table records the owner.
        let digest = if fencing {
            owner_digest(&owner)
        } else {
            String::new()
        };
        let ids: Vec<i64> = sent.iter().map(|lock| lock.id).collect();
        let names: Vec<Option<&str>> = sent
            .iter()
            .map(|lock| GrantRecord::name_of(lock.key))
            .collect();
        attempt.sent_on = Some(session.clone());
        let context = || {
            format!(
                "try {} keys from {:?} on {}",
                sent.len(),
                first.key,
                self.settings.target
            )
        };
        // On an error or no answer, `attempt` cleans up as it drops.
        let answer = errors::within(
            "acquire",
            self.settings.query_timeout,
            context,
            session.try_lock_any(&ids, &names, &digest, &record, fencing),
        )
        .await
        // The statement was sent: it may have taken a key.
        .map_err(Error::with_outcome_unknown)?;
        let Some((id, token)) = answer else {
            attempt.finish();
            return Ok(none_free);
        };
        let Some(&lock) = sent.iter().find(|lock| lock.id == id) else {
            return Err(Error::backend(
                BACKEND,
                "acquire",
                format!(
                    "{}: the server took advisory key {id}, which was not asked for",
                    context()
                ),
            ));
        };
        let lease = self.record_grant(lock, ttl, owner, token, session, lease_locker, false)?;
        attempt.finish();
        Ok(AnyRound::Granted(lease))
    }

    /// The one shared attempt on `session` that `ticket` reserves (no
    /// reader of this locker holds the key there): `pg_try_advisory_lock_shared`
    /// and, with fencing, the read of the key's counter, in one round trip;
    /// a grant is recorded. The guard releases a shared hold the attempt may
    /// have left if its answer never arrives.
    pub(super) async fn attempt_shared(
        &self,
        lock: LockKey<'_>,
        ttl: Duration,
        session: Arc<Session>,
        ticket: Ticket,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Tried> {
        let attempt = Attempt {
            registry: self.core.registry.clone(),
            tickets: vec![ticket],
            sent_on: Some(session.clone()),
            query_timeout: self.settings.query_timeout,
            shared: true,
        };
        let owner = new_owner_token();
        let context = || format!("try {:?} (shared) on {}", lock.key, self.settings.target);
        // On an error or no answer, `attempt` cleans up as it drops.
        let answer = errors::within(
            "acquire",
            self.settings.query_timeout,
            context,
            session.try_lock_shared(lock.id),
        )
        .await
        // The statement was sent: it may have taken the lock.
        .map_err(Error::with_outcome_unknown)?;
        self.answered(attempt, answer, lock, ttl, owner, session, lease_locker)
    }

    /// Records the answer to one attempt sent on `session` under `attempt`:
    /// a grant (`Some(token)`) becomes a lease, exclusive or shared as the
    /// attempt was. Should recording fail, `attempt` releases the lock as
    /// it drops.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn answered(
        &self,
        attempt: Attempt,
        answer: Option<Option<i64>>,
        lock: LockKey<'_>,
        ttl: Duration,
        owner: String,
        session: Arc<Session>,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Tried> {
        let shared = attempt.shared;
        let tried = match answer {
            Some(token) => {
                let lease =
                    self.record_grant(lock, ttl, owner, token, session, lease_locker, shared)?;
                Tried::Granted(lease)
            }
            None => Tried::Contended,
        };
        attempt.finish();
        Ok(tried)
    }

    /// A reader joining the shared hold `session` has of the key for other
    /// readers of this locker, carrying their `fencing_token`: `None` if
    /// that hold ended meanwhile (ask again). Refused (contention) while an
    /// exclusive request waits for the key on the server, as the server
    /// refuses a new reader from any other session then: re-entrant
    /// requests would skip its queue, and this locker's readers would
    /// starve the writer. Cancel-safe: the question changes nothing.
    pub(super) async fn join(
        &self,
        lock: LockKey<'_>,
        ttl: Duration,
        session: &Arc<Session>,
        fencing_token: Option<u64>,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Option<Tried>> {
        let context = || format!("try {:?} (shared) on {}", lock.key, self.settings.target);
        let queued = session.writer_queued(lock.id);
        if errors::within("acquire", self.settings.query_timeout, context, queued).await? {
            return Ok(Some(Tried::Contended));
        }
        let core = &self.core;
        let joined = core.join(
            &lock.id,
            lock.key,
            ttl,
            fencing_token,
            session.clone(),
            lease_locker,
        );
        Ok(joined.map(Tried::Granted))
    }
}

/// A counter read from the fencing table as a lease's token.
fn fencing_token(lock: LockKey<'_>, token: Option<i64>) -> Result<Option<u64>> {
    token
        .map(|t| {
            u64::try_from(t).map_err(|_| {
                Error::backend(
                    BACKEND,
                    "acquire",
                    format!(
                        "the fencing counter of {:?} is negative ({t}); was the table edited?",
                        lock.key
                    ),
                )
            })
        })
        .transpose()
}

/// The `lock_timeout` for a wait with `remaining` left: rounded up (a wait
/// must not end before the caller's deadline), at least 1 ms (0 would mean
/// "no timeout"), at most Postgres' maximum.
pub(super) fn lock_timeout_ms(remaining: Duration) -> u64 {
    let ms = remaining
        .as_nanos()
        .div_ceil(1_000_000)
        .clamp(1, MAX_LOCK_TIMEOUT_MS);
    ms as u64
}

/// What one round of a [`Locker::try_lock_any`] found.
enum AnyRound<'k> {
    /// A key was taken: its lease.
    Granted(Lease),
    /// None of the keys sent was free. `in_flight`: keys left out because
    /// another caller of this locker was trying them (not known to be
    /// held); `cleaning_up`: a key left out because an abandoned attempt on
    /// it is still being cleaned up.
    NoneFree {
        in_flight: Vec<LockKey<'k>>,
        cleaning_up: Option<&'k str>,
    },
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::postgres::errors::is_lock_timeout;
    use crate::postgres::session::WaitError;
    use crate::postgres::PostgresLocker;
    use crate::sql::fencing::owner_digest;

    #[test]
    fn lock_timeouts_round_up_and_stay_in_range() {
        assert_eq!(lock_timeout_ms(Duration::ZERO), 1);
        assert_eq!(lock_timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(lock_timeout_ms(Duration::from_micros(1500)), 2);
        assert_eq!(lock_timeout_ms(Duration::from_secs(2)), 2000);
        assert_eq!(
            lock_timeout_ms(Duration::from_secs(365 * 86400)),
            i32::MAX as u64
        );
    }

    const TTL: Duration = Duration::from_secs(30);

    /// A session of `inner`'s pool for waits, which must have a free permit.
    async fn wait_session(inner: &Inner) -> Arc<Session> {
        inner
            .core
            .pool
            .waiter()
            .await
            .unwrap()
            .expect("a free permit")
    }

    /// Polls until `condition` holds, or panics after 5 s.
    async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let started = Instant::now();
        while !condition() {
            assert!(started.elapsed() < Duration::from_secs(5), "{what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A waiter connection of `locker`'s pool.
    /// Waits on the server (ungranted advisory locks) for advisory key `id`.
    fn server_waits(server: &test_servers::PostgresServer, id: i64) -> usize {
        server
            .psql(&format!(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND ((classid::int8 << 32) | objid::int8) = {id}"
            ))
            .parse()
            .unwrap()
    }

    /// A waiter connection's permit comes back on every way out of a native
    /// wait: timed out, cancelled, failed, won then released, won then
    /// dropped, won then its connection died. A leaked permit would turn
    /// every later wait into polling. With `idle_waiters=0` every connection
    /// is closed after use, so "in use" is exactly "permits taken".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiter_permits_come_back_on_every_path() {
        let server = test_servers::PostgresServer::start();
        let url = format!("{}&max_waiters=2&idle_waiters=0", server.url());
        let locker = PostgresLocker::from_url(&url).await.unwrap();
        let holder = PostgresLocker::from_url(&server.url()).await.unwrap();
        let pool = &locker.inner.core.pool;
        let key = "permits";
        let id = locker.advisory_key(key);
        let in_use = || pool.waiters_in_use();
        let spawn_wait = |timeout: Duration| {
            let locker = locker.clone();
            tokio::spawn(async move { locker.lock(key, TTL, timeout).await })
        };
        let held = holder.try_lock(key, TTL).await.unwrap().expect("free");

        // Timed out.
        let err = locker
            .lock(key, TTL, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert_eq!(in_use(), 0, "after a timeout");

        // Cancelled while waiting on the server.
        let task = spawn_wait(Duration::from_secs(30));
        eventually("the wait reaches the server", || {
            server_waits(&server, id) == 1
        })
        .await;
        assert_eq!(in_use(), 1);
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert_eq!(in_use(), 0, "after a cancellation");

        // Failed: the waiting backend is terminated.
        let task = spawn_wait(Duration::from_secs(30));
        eventually("the wait reaches the server", || {
            server_waits(&server, id) == 1
        })
        .await;
        server.psql(&format!(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks WHERE locktype = 'advisory' \
             AND NOT granted AND ((classid::int8 << 32) | objid::int8) = {id}"
        ));
        let err = task.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{err}");
        assert_eq!(in_use(), 0, "after a failed wait");
        held.release().await.unwrap();

        // Won, then released / dropped / its connection dies.
        for ending in ["release", "drop", "terminate"] {
            let held = holder.try_lock(key, TTL).await.unwrap().expect("free");
            let task = spawn_wait(Duration::from_secs(30));
            eventually("the wait reaches the server", || {
                server_waits(&server, id) == 1
            })
            .await;
            held.release().await.unwrap();
            let won = task.await.unwrap().unwrap();
            assert_eq!(in_use(), 1, "{ending}: the winner keeps its connection");
            match ending {
                "release" => {
                    won.release().await.unwrap();
                    assert_eq!(in_use(), 0, "after a release");
                }
                "drop" => {
                    drop(won);
                    eventually("a dropped lease gives its connection back", || {
                        in_use() == 0
                    })
                    .await;
                }
                _ => {
                    let mut lost = won.lost_signal();
                    let pid = server
                        .advisory_locks()
                        .into_iter()
                        .find(|(_, k)| *k == id)
                        .expect("held")
                        .0;
                    server.psql(&format!("SELECT pg_terminate_backend({pid}, 5000)"));
                    tokio::time::timeout(Duration::from_secs(2), lost.wait())
                        .await
                        .expect("lost");
                    assert_eq!(in_use(), 0, "after the connection died");
                }
            }
        }

        // Both permits are free: two waits get connections, a third polls
        // (and times out as a timeout, not as contention).
        let keys = ["permits-a", "permits-b", "permits-c"];
        let mut held = Vec::new();
        for key in keys {
            held.push(holder.try_lock(key, TTL).await.unwrap().expect("free"));
        }
        let waits: Vec<_> = keys[..2]
            .iter()
            .map(|&key| {
                let locker = locker.clone();
                tokio::spawn(async move { locker.lock(key, TTL, Duration::from_secs(30)).await })
            })
            .collect();
        eventually("two native waits", || in_use() == 2).await;
        let started = Instant::now();
        let err = locker
            .lock(keys[2], TTL, Duration::from_millis(300))
            .await
            .unwrap_err();
        match err {
            Error::Timeout { waited, .. } => assert!(waited >= Duration::from_millis(300)),
            other => panic!("{other}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            server_waits(&server, locker.advisory_key(keys[2])),
            0,
            "polled"
        );
        assert_eq!(in_use(), 2);
        drop(held);
        for wait in waits {
            wait.await.unwrap().unwrap().release().await.unwrap();
        }
        assert_eq!(in_use(), 0);
    }

    /// The state a grant racing `lock_timeout` leaves behind (the wait
    /// statement failed with 55P03, yet the session holds the lock) cannot
    /// be produced on demand, so it is built by hand: the lock is kept, with
    /// a fresh fencing token, and a session without it reports no grant.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_reported_as_a_lock_timeout_is_kept() {
        let server = test_servers::PostgresServer::start();
        let locker = PostgresLocker::from_url(&server.url()).await.unwrap();
        let inner = &locker.inner;
        let lock = LockKey {
            id: -4242,
            key: "-4242",
        };
        let digest = owner_digest("owner");
        let record = GrantRecord::new(lock.key, TTL, true);
        let (raced, bystander) = (wait_session(inner).await, wait_session(inner).await);
        raced
            .query("SELECT pg_advisory_lock(-4242)", &[])
            .await
            .unwrap();

        assert_eq!(
            inner
                .granted_anyway(&bystander, lock, &digest, &record)
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            inner
                .granted_anyway(&raced, lock, &digest, &record)
                .await
                .unwrap(),
            Some(Some(1))
        );
        let recorded = server.psql(&format!(
            "SELECT token, owner_digest = '{digest}', key_name, ttl_ms, holder_pid, \
             session_pid = (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 4294963054 AND granted) \
             FROM distlock_fencing WHERE lock_key = -4242"
        ));
        assert_eq!(
            recorded,
            format!("1|t|-4242|30000|{}|t", std::process::id()),
            "the kept grant records its holder too"
        );
    }

    /// A wait's own `lock_timeout` ends with the wait, won or timed out: the
    /// session is back under the session's bound (so a counter bump after a
    /// racing grant is not held to the wait's last few milliseconds), the
    /// role's `statement_timeout` stays off and `idle_session_timeout` at
    /// distlock's own (the server's end for a session it no longer hears).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_leaves_the_session_settings_as_it_found_them() {
        let server = test_servers::PostgresServer::start();
        server.psql("ALTER ROLE postgres SET statement_timeout = '100ms'");
        let locker = PostgresLocker::from_url(&server.url()).await.unwrap();
        let inner = &locker.inner;
        let session = wait_session(inner).await;
        let show = |name: &'static str| {
            let session = session.clone();
            async move {
                let rows = session.query(&format!("SHOW {name}"), &[]).await.unwrap();
                rows[0].get::<_, String>(0)
            }
        };
        assert_eq!(show("statement_timeout").await, "0");
        assert_eq!(show("idle_session_timeout").await, "10s");
        assert_eq!(show("lock_timeout").await, "1500ms");
        let digest = owner_digest("owner");
        let session_ms = inner.settings.session_lock_timeout_ms();
        let record = GrantRecord::new("-77", TTL, true);

        let won = inner.sql.wait(-77, 250, session_ms, &digest, &record);
        assert_eq!(session.wait(&won, true).await.unwrap(), Some(1));
        assert_eq!(show("lock_timeout").await, "1500ms", "after a won wait");

        let other = wait_session(inner).await;
        other
            .query("SELECT pg_advisory_lock(-78)", &[])
            .await
            .unwrap();
        let timed_out = inner.sql.wait(-78, 50, session_ms, &digest, &record);
        match session.wait(&timed_out, true).await {
            Err(WaitError::Postgres(e)) => assert!(is_lock_timeout(&e), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(show("lock_timeout").await, "1500ms", "after a lock timeout");
    }
}
