//! What the shared SQL flows ask of Postgres
//! ([`Dialect`](crate::sql::dialect::Dialect)): the statements that take,
//! release, confirm, forget, mark and inspect a lock, and how their answers
//! read.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::lock_timeout_ms;
use super::cleanup::{Attempt, CancelWait};
use super::errors::{self, is_concurrent_create, is_lock_timeout, BACKEND};
use super::fencing::GrantRecord;
use super::inspect::Hold;
use super::keys::LockKey;
use super::pool::Connect;
use super::session::{Session, WaitError};
use super::Inner;
use crate::deadline::{bounded, saturating_deadline};
use crate::inspect::HeldLock;
use crate::session_registry::{Busy, ForReader};
use crate::sql::core::{Core, Tried, WaitGuard, WaitOn};
use crate::sql::dialect::{Dialect, HolderAnswer, On, Ours};
use crate::sql::fencing::owner_digest;
use crate::{new_owner_token, Error, Lease, Locker, MarkAdvance, Result};

/// How long `pg_terminate_backend` waits for the terminated backend to exit
/// (and so free its locks) before it reports failure (Postgres 14+).
const TERMINATE_WAIT: Duration = Duration::from_secs(5);

impl Dialect for Inner {
    type Connect = Connect;
    type Holder = i32;
    type Id = i64;

    // `pg_advisory_lock_shared`: see `try_once_shared`.
    const NO_SHARED_LOCKS: Option<&'static str> = None;

    // One scan of `pg_locks` answers for any number of keys.
    const HOLDS_PER_STATEMENT: usize = usize::MAX;

    fn core(&self) -> &Core<Connect, i64> {
        &self.core
    }

    /// One attempt on the key's shared session; a grant is recorded. A
    /// guard releases whatever an attempt left behind if its answer never
    /// arrives (see [`Attempt`]).
    async fn try_once(
        &self,
        &lock: &LockKey<'_>,
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Tried> {
        let ticket = match self.core.registry.reserve(lock.id) {
            Ok(ticket) => ticket,
            Err(Busy::Contended) => return Ok(Tried::Contended),
            Err(Busy::CleaningUp) => return Ok(Tried::CleaningUp),
        };
        let mut attempt = Attempt {
            registry: self.core.registry.clone(),
            tickets: vec![ticket],
            sent_on: None,
            query_timeout: self.settings.query_timeout,
            shared: false,
        };
        // Read on the caller's task, where its label scope is.
        let record = GrantRecord::new(lock.key, ttl, self.settings.holder_record);
        let session = self.core.pool.shared(&lock.id).await?;
        let owner = new_owner_token();
        // Only the fencing table records the owner.
        let digest = if self.sql.fencing() {
            owner_digest(&owner)
        } else {
            String::new()
        };
        attempt.sent_on = Some(session.clone());
        // On an error or no answer, `attempt` cleans up as it drops.
        let context = || format!("try {:?} on {}", lock.key, self.settings.target);
        let answer = errors::within(
            "acquire",
            self.settings.query_timeout,
            context,
            session.try_lock(lock.id, &digest, &record, self.sql.fencing()),
        )
        .await
        // The statement was sent: it may have taken the lock.
        .map_err(Error::with_outcome_unknown)?;
        self.answered(attempt, answer, lock, ttl, owner, session, lease_locker)
    }

    /// One statement over every key (see [`Inner::attempt_any`]).
    async fn try_once_any(
        &self,
        locks: &[LockKey<'_>],
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Option<Lease>> {
        self.attempt_any(locks, ttl, lease_locker).await
    }

    /// The wait on the server (`pg_advisory_lock` under `lock_timeout`),
    /// after the first attempt found the key held.
    async fn wait_on(
        &self,
        &lock: &LockKey<'_>,
        ttl: Duration,
        on: WaitOn<Session>,
    ) -> Result<Lease> {
        let session = &on.session;
        let digest = owner_digest(&on.owner);
        let record = GrantRecord::new(lock.key, ttl, self.settings.holder_record);
        let mut wait = self.wait_guard(session);
        let token = loop {
            let lock_timeout_ms = lock_timeout_ms(on.remaining());
            let sql = self.sql.wait(
                lock.id,
                lock_timeout_ms,
                self.settings.session_lock_timeout_ms(),
                &digest,
                &record,
            );
            let context = || format!("wait for {:?} on {}", lock.key, self.settings.target);
            let waited = self
                .wait_statement(session, &sql, lock_timeout_ms, self.sql.fencing())
                .await?;
            match waited {
                Ok(token) => break token,
                Err(WaitError::Postgres(e)) if is_lock_timeout(&e) => {
                    if let Some(token) =
                        self.granted_anyway(session, lock, &digest, &record).await?
                    {
                        break token;
                    }
                    self.give_up_if_out_of_time(&on, &mut wait, lock.key)?;
                    // A wait longer than Postgres' largest lock_timeout: go on.
                }
                // `wait` closes the connection as it drops: whatever the
                // failed statement left behind goes with it.
                Err(e) => return Err(e.into_error(context())),
            }
        };
        wait.disarm();
        self.grant_waited(lock, ttl, on, token, false)
    }

    /// One shared attempt on the key's shared session. That session holds
    /// the key shared **once**, however many readers of this locker are on
    /// it (see [`session_registry`](crate::session_registry)): the first
    /// reader takes it (`pg_try_advisory_lock_shared`, reserved and
    /// cleaned up like an exclusive attempt), later ones join that hold
    /// after asking the server whether a writer waits for the key, and
    /// only the last one to leave releases it. A reader arriving while
    /// another attempt of this locker on the key is in flight waits (at
    /// most the query timeout) for its outcome rather than report
    /// contention that is not there.
    async fn try_once_shared(
        &self,
        &lock: &LockKey<'_>,
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Tried> {
        let session = self.core.pool.shared(&lock.id).await?;
        let registry = &self.core.registry;
        let give_up_at = saturating_deadline(Instant::now(), self.settings.query_timeout);
        loop {
            let settled = registry.settled();
            tokio::pin!(settled);
            settled.as_mut().enable();
            match registry.reserve_shared(lock.id, session.id) {
                Err(Busy::Contended) => return Ok(Tried::Contended),
                Err(Busy::CleaningUp) => return Ok(Tried::CleaningUp),
                Ok(ForReader::Attempt(ticket)) => {
                    return self
                        .attempt_shared(lock, ttl, session, ticket, lease_locker)
                        .await
                }
                Ok(ForReader::Join { fencing_token }) => {
                    let joined =
                        self.join(lock, ttl, &session, fencing_token, lease_locker.clone());
                    if let Some(tried) = joined.await? {
                        return Ok(tried);
                    }
                    // The hold ended before the join was recorded: ask again.
                }
                Ok(ForReader::Settling) => {
                    if tokio::time::timeout_at(give_up_at, settled).await.is_err() {
                        // Still in flight: as for an exclusive attempt, a
                        // grant in progress here is contention.
                        return Ok(Tried::Contended);
                    }
                }
            }
            if Instant::now() >= give_up_at {
                return Ok(Tried::Contended);
            }
        }
    }

    /// The wait on the server (`pg_advisory_lock_shared` under
    /// `lock_timeout`), after the first attempt found the key held
    /// exclusively (or a writer waiting for it: the server queues this
    /// reader behind that writer). Nothing is written; the token is read
    /// after the grant.
    async fn wait_on_shared(
        &self,
        &lock: &LockKey<'_>,
        ttl: Duration,
        on: WaitOn<Session>,
    ) -> Result<Lease> {
        let session = &on.session;
        let mut wait = self.wait_guard(session);
        let context = || {
            format!(
                "wait for {:?} (shared) on {}",
                lock.key, self.settings.target
            )
        };
        loop {
            let lock_timeout_ms = lock_timeout_ms(on.remaining());
            let sql = self.sql.wait_shared(
                lock.id,
                lock_timeout_ms,
                self.settings.session_lock_timeout_ms(),
            );
            let waited = self
                .wait_statement(session, &sql, lock_timeout_ms, false)
                .await?;
            match waited {
                Ok(_) => break,
                Err(WaitError::Postgres(e)) if is_lock_timeout(&e) => {
                    // Granted as the timeout fired (see `granted_anyway`):
                    // kept. The waiter connection holds nothing else.
                    let holds = session.holds(lock.id);
                    let query_timeout = self.settings.query_timeout;
                    if errors::within("acquire", query_timeout, context, holds).await? {
                        break;
                    }
                    self.give_up_if_out_of_time(&on, &mut wait, lock.key)?;
                    // A wait longer than Postgres' largest lock_timeout: go on.
                }
                // `wait` closes the connection as it drops: whatever the
                // failed statement left behind goes with it.
                Err(e) => return Err(e.into_error(context())),
            }
        }
        // In a statement of its own, after the grant: its snapshot sees
        // every writer's bump. If it fails, `wait` closes the connection,
        // and the hold goes with it.
        let read = session.reader_token(lock.id);
        let token = errors::within("acquire", self.settings.query_timeout, context, read).await?;
        wait.disarm();
        self.grant_waited(lock, ttl, on, token, true)
    }

    async fn unlock_shared(&self, on: On<'_, Self>) -> Result<bool> {
        let unlock = on.session.unlock_shared(*on.id);
        errors::within("release", self.settings.query_timeout, on.context, unlock).await
    }

    /// Deletes the key's fencing row in one statement, under a transaction
    /// lock on the key that only a free key grants (nothing to delete
    /// without fencing). The key is reserved first (see
    /// [`Core::reserve_to_forget`](crate::sql::core::Core::reserve_to_forget)).
    async fn forget(&self, &lock: &LockKey<'_>) -> Result<()> {
        // No cleanup is ever needed on the server: the statement's lock ends
        // with its transaction, whether or not we wait for the answer. A
        // later attempt on the shared session is queued behind it.
        let _reserved = self.core.reserve_to_forget(lock.id, lock.key)?;
        let session = self.core.pool.shared(&lock.id).await?;
        let context = || format!("forget {:?} on {}", lock.key, self.settings.target);
        let rows = errors::within(
            "forget",
            self.settings.query_timeout,
            context,
            session.query(&self.sql.forget, &[&lock.id]),
        )
        .await?;
        let free = rows
            .first()
            .map(|row| row.try_get::<_, bool>(0))
            .transpose()
            .map_err(|e| errors::backend("forget", context(), e))?;
        match free {
            Some(true) => Ok(()),
            Some(false) => Err(Error::NotAcquired {
                key: lock.key.to_owned(),
            }),
            None => Err(Error::backend(
                errors::BACKEND,
                "forget",
                format!("{}: the server returned no row", context()),
            )),
        }
    }

    /// One upsert on the marks table (`distlock_marks`, in the fencing
    /// table's schema) on the key's shared session, after creating the
    /// table on this locker's first call; the mark's row is keyed by the
    /// lock's advisory key. A lost answer leaves the outcome unknown.
    async fn advance_mark(&self, &lock: &LockKey<'_>, value: i64) -> Result<MarkAdvance> {
        let session = self.core.pool.shared(&lock.id).await?;
        let timeout = self.settings.query_timeout;
        let context = || format!("advance the mark {:?} on {}", lock.key, self.core.target);
        if !self.marks_ready.load(Ordering::Acquire) {
            let create = async { Ok(session.query(&self.marks.create, &[]).await) };
            let created = bounded(errors::BACKEND, "advance_mark", timeout, create).await?;
            match created {
                Ok(_) => {}
                // Another client created it in between: it exists now.
                Err(e) if is_concurrent_create(&e) => {}
                Err(e) => return Err(errors::backend("advance_mark", context(), e)),
            }
            self.marks_ready.store(true, Ordering::Release);
        }
        let rows = errors::within(
            "advance_mark",
            timeout,
            context,
            session.query(&self.marks.advance, &[&lock.id, &value, &lock.key]),
        )
        .await
        // The statement may have committed before its answer was lost.
        .map_err(Error::with_outcome_unknown)?;
        if let Some(row) = rows.first() {
            let previous = row
                .try_get(1)
                .map_err(|e| errors::backend("advance_mark", context(), e))?;
            return Ok(MarkAdvance::Advanced { previous });
        }
        let rows = errors::within(
            "advance_mark",
            timeout,
            context,
            session.query(&self.marks.current, &[&lock.id]),
        )
        .await?;
        let current = rows
            .first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(|e| errors::backend("advance_mark", context(), e))?;
        match current {
            Some(current) => Ok(MarkAdvance::AlreadyAt { current }),
            None => Err(Error::backend(
                errors::BACKEND,
                "advance_mark",
                format!("{}: the mark was neither advanced nor found", context()),
            )),
        }
    }

    /// The held advisory locks of this database joined with their fencing
    /// rows, whose recorded name starts with `prefix` and that `ours` says
    /// this locker would lock under that name (string keys in its
    /// namespace, or raw keys), sorted by name. Locks without a fencing row
    /// (taken with plain SQL, or by a distlock without fencing) have no
    /// name and are not listed. [`Error::Unsupported`] without fencing.
    async fn list(&self, prefix: &str, ours: Ours<'_, i64>) -> Result<Vec<HeldLock>> {
        if !self.sql.fencing() {
            return Err(Error::unsupported(
                BACKEND,
                "list",
                "without the fencing table (fencing=off) no lock records its key's name, \
                         so held advisory locks cannot be listed by name; inspect a key instead",
            ));
        }
        // A listing reads the whole fencing table and `pg_locks`, which may
        // take seconds: on a waiter connection, which holds no lock, not on
        // a shared session, whose silence meanwhile would be taken for the
        // server's and give its locks up. (All waiter connections in use:
        // the shared one it is.)
        let (session, waiter) = match self.core.pool.waiter().await? {
            Some(waiter) => (waiter, true),
            None => (self.core.pool.shared(&0_i64).await?, false),
        };
        let context = || format!("list locks under {prefix:?} on {}", self.settings.target);
        let rows = errors::within(
            "list",
            self.settings.query_timeout,
            context,
            session.query(&self.sql.list, &[&prefix]),
        )
        .await?;
        if waiter {
            self.core.pool.recycle(session);
        }
        let mut listed = Vec::with_capacity(rows.len());
        for row in &rows {
            let hold =
                Hold::from_row(row, None).map_err(|e| errors::backend("list", context(), e))?;
            if let (Some(name), Some(lock_key)) = (&hold.key_name, hold.lock_key) {
                if ours(name, &lock_key) {
                    listed.push(hold.held);
                }
            }
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    /// One statement: the key's hold in `pg_locks` joined with its fencing
    /// row (see the [module docs](super#inspection)).
    async fn find_hold(
        &self,
        &lock: &LockKey<'_>,
        operation: &'static str,
    ) -> Result<Option<(i32, HeldLock)>> {
        let session = self.core.pool.shared(&lock.id).await?;
        let context = || format!("inspect {:?} on {}", lock.key, self.settings.target);
        let rows = errors::within(
            operation,
            self.settings.query_timeout,
            context,
            session.query(&self.sql.inspect, &[&lock.id]),
        )
        .await?;
        // Several rows only for a key held shared, by several sessions:
        // report the first (`shared`; ending its holder ends them all, see
        // `end_holder`).
        let hold = rows.first().map(|row| Hold::from_row(row, Some(lock.key)));
        let hold = hold.transpose();
        let hold = hold.map_err(|e| errors::backend(operation, context(), e))?;
        Ok(hold.map(|hold| (hold.pid, hold.held)))
    }

    /// `pg_terminate_backend` of server process `pid` if it still holds
    /// the key, and of every other session holding it (the readers of a key
    /// held shared), waiting for each to exit: true if they did, false if
    /// `pid` no longer held the key. It frees **every** lock those sessions
    /// hold. Nothing is ended if this locker's own session is among them.
    async fn end_holder(&self, &lock: &LockKey<'_>, pid: i32) -> Result<bool> {
        let session = self.core.pool.shared(&lock.id).await?;
        let wait_ms = i64::try_from(TERMINATE_WAIT.as_millis()).unwrap_or(i64::MAX);
        let context = || {
            format!(
                "end server process {pid}, which holds {:?}, on {} (pg_terminate_backend needs the \
                 holder's role, membership in pg_signal_backend, or superuser; and Postgres 14+)",
                lock.key, self.settings.target
            )
        };
        let rows = errors::within(
            "force_release",
            self.settings.query_timeout.saturating_add(TERMINATE_WAIT),
            context,
            session.query(&self.sql.terminate, &[&lock.id, &pid, &wait_ms]),
        )
        .await?;
        let Some(row) = rows.first() else {
            return Ok(false);
        };
        let (own, terminated): (bool, Option<bool>) = (|| Ok((row.try_get(0)?, row.try_get(1)?)))()
            .map_err(|e: tokio_postgres::Error| errors::backend("force_release", context(), e))?;
        match (own, terminated) {
            (true, _) => Err(Error::unsupported(BACKEND, "force_release", format!(
                    "{:?} is held by this locker's own session (server process {pid}); release its \
                     lease, or force-release it from another client",
                    lock.key
                ))),
            (false, Some(true)) => Ok(true),
            (false, _) => Err(Error::backend(
                BACKEND,
                "force_release",
                format!(
                    "server process {pid} holding {:?} was told to exit but had not within {TERMINATE_WAIT:?}; \
                     the lock may still be held (inspect it)",
                    lock.key
                ),
            )),
        }
    }

    async fn unlock(&self, on: On<'_, Self>, clear_record: bool) -> Result<bool> {
        let (limit, id) = (self.settings.query_timeout, *on.id);
        if clear_record {
            errors::within("release", limit, on.context, on.session.unlock(id)).await
        } else {
            let unlock = on.session.unlock_if_held(id);
            errors::within("release", limit, on.context, unlock).await
        }
    }

    async fn holder(&self, on: On<'_, Self>, owner: &str) -> Result<HolderAnswer> {
        let digest = owner_digest(owner);
        let lookup = async {
            if self.sql.fencing() {
                on.session.query(&self.sql.holder, &[on.id, &digest]).await
            } else {
                on.session.query(&self.sql.holder, &[on.id]).await
            }
        };
        let limit = self.settings.query_timeout;
        let rows = errors::within("release", limit, on.context, lookup).await?;
        let Some(row) = rows.first() else {
            return Ok((None, None));
        };
        let columns =
            || Ok::<_, tokio_postgres::Error>((row.try_get::<_, i32>(0)?, row.try_get(1)?));
        let (pid, same_owner): (i32, Option<bool>) =
            columns().map_err(|e| errors::backend("release", (on.context)(), e))?;
        let who = format!("server process {pid}");
        Ok((
            Some((who, format!("pg_terminate_backend({pid})"))),
            same_owner,
        ))
    }

    async fn holds(&self, on: On<'_, Self>) -> Result<bool> {
        let holds = on.session.holds(*on.id);
        errors::within("refresh", self.settings.query_timeout, on.context, holds).await
    }

    fn held_among<'s>(
        &'s self,
        session: Arc<Session>,
        ids: &[&i64],
    ) -> impl Future<Output = Result<Vec<bool>>> + Send + use<'s> {
        let ids: Vec<i64> = ids.iter().map(|&&id| id).collect();
        // Each key once: readers of one locker on one session share its one
        // hold, and `EXCEPT ALL` would count a key asked twice but held once
        // as lost.
        let mut asked = ids.clone();
        asked.sort_unstable();
        asked.dedup();
        async move {
            let target = &self.settings.target;
            let context = || format!("verify {} held locks on {target}", asked.len());
            let limit = self.settings.query_timeout;
            let lost: HashSet<i64> =
                errors::within("refresh", limit, context, session.lost_among(&asked))
                    .await?
                    .into_iter()
                    .collect();
            Ok(ids.iter().map(|id| !lost.contains(id)).collect())
        }
    }
}

/// The steps the exclusive and the shared waits on the server share.
impl Inner {
    /// The guard of a wait on `session`: dropped before it is disarmed (the
    /// caller's future cancelled, an error), it cancels the wait on the
    /// server and closes the connection, so nothing stays held.
    fn wait_guard(&self, session: &Arc<Session>) -> WaitGuard<Session, CancelWait> {
        let cancel = CancelWait {
            tls: self.settings.tls.clone(),
        };
        WaitGuard::new(session.clone(), cancel)
    }

    /// Sends one wait statement `sql` (whose `lock_timeout` is
    /// `lock_timeout_ms`) on `session`: the server ends the wait itself, and
    /// the bound here only catches a server that stopped answering.
    async fn wait_statement(
        &self,
        session: &Session,
        sql: &str,
        lock_timeout_ms: u64,
        fencing: bool,
    ) -> Result<std::result::Result<Option<i64>, WaitError>> {
        let bound =
            Duration::from_millis(lock_timeout_ms).saturating_add(self.settings.query_timeout);
        bounded(BACKEND, "acquire", bound, async {
            Ok(session.wait(sql, fencing).await)
        })
        .await
    }

    /// After a `lock_timeout` that did not grant the key: the caller's
    /// timeout error once its time is up, with the waiter connection
    /// (which holds nothing) kept for reuse; `Ok` to wait again.
    fn give_up_if_out_of_time(
        &self,
        on: &WaitOn<Session>,
        wait: &mut WaitGuard<Session, CancelWait>,
        key: &str,
    ) -> Result<()> {
        if on.remaining().is_zero() {
            wait.disarm();
            self.core.pool.recycle(on.session.clone());
            return Err(on.timed_out(key));
        }
        Ok(())
    }

    /// The lease of a wait that was granted the key, on its waiter session.
    fn grant_waited(
        &self,
        lock: LockKey<'_>,
        ttl: Duration,
        on: WaitOn<Session>,
        token: Option<i64>,
        shared: bool,
    ) -> Result<Lease> {
        self.record_grant(
            lock,
            ttl,
            on.owner,
            token,
            on.session,
            on.lease_locker,
            shared,
        )
    }
}
