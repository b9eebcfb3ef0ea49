//! What the shared SQL flows ask of MySQL
//! ([`Dialect`](crate::sql::dialect::Dialect)): the statements that take,
//! release, confirm, forget, mark and inspect a lock, and how their answers
//! read.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::{Attempt, Got, KillQuery};
use super::errors::{self, BACKEND};
use super::fencing::{FencingTable, Sql, MAX_WAIT};
use super::inspect::{column, read_hold, LIST_NAME_COLUMN};
use super::marks::advance_sql;
use super::names::LockName;
use super::pool::Connect;
use super::session::{Answer, Request, Session};
use super::Inner;
use crate::inspect::{GrantRecord, HeldLock};
use crate::session_registry::Busy;
use crate::sql::core::{Core, Reserved, Tried, WaitGuard, WaitOn};
use crate::sql::dialect::{Dialect, HolderAnswer, On, Ours};
use crate::sql::fencing::owner_digest;
use crate::{new_owner_token, Error, Lease, Locker, MarkAdvance, Result};

/// How long a force release waits for the killed connection's locks to be
/// freed (the server ends the killed thread asynchronously).
const KILL_WAIT: Duration = Duration::from_secs(5);

impl Dialect for Inner {
    type Connect = Connect;
    type Holder = u64;
    type Id = String;

    const NO_SHARED_LOCKS: Option<&'static str> =
        Some("MySQL's GET_LOCK has no shared mode: a named lock is exclusive only");

    /// A column each: a statement of about 30 KB, far under the default
    /// `max_allowed_packet` (16 MB on MariaDB 10.11, 64 MB on MySQL 8).
    const HOLDS_PER_STATEMENT: usize = 256;

    fn core(&self) -> &Core<Connect, String> {
        &self.core
    }

    /// One attempt on the name's shared session; a grant is recorded.
    async fn try_once(
        &self,
        name: &LockName<'_>,
        ttl: Duration,
        lease_locker: Arc<dyn Locker>,
    ) -> Result<Tried> {
        let ticket = match self.core.registry.reserve(name.id.clone()) {
            Ok(ticket) => ticket,
            Err(Busy::Contended) => return Ok(Tried::Contended),
            Err(Busy::CleaningUp) => return Ok(Tried::CleaningUp),
        };
        let mut attempt = Attempt {
            registry: self.core.registry.clone(),
            ticket: ticket.clone(),
            reserved: Some(Reserved::new(self.core.registry.clone(), ticket)),
            answered: false,
        };
        // Read on the caller's task, where its label scope is.
        let record = GrantRecord::new(name.key, ttl, self.settings.holder_record);
        let session = self.core.pool.shared(&name.id).await?;
        let owner = new_owner_token();
        let digest = owner_digest(&owner);
        let limit = self.settings.query_timeout;
        let (sql, reading) = self.sql.acquire(name, &digest, Duration::ZERO, &record);
        let request = Request {
            sql,
            limit,
            undo: Some(Sql::undo(name)),
            keep: attempt.reserved.take().map(|r| Box::new(r) as _),
            close_if_abandoned: false,
        };
        let context = || format!("try {:?} on {}", name.key, self.settings.target);
        let answer = session
            .ask(request, "acquire", &context)
            .await
            // The statement was sent: it may have taken the lock.
            .map_err(Error::with_outcome_unknown)?;
        attempt.answered = true;
        match self.got(&answer, reading, &context)? {
            Got::Granted(token) => {
                let lease = self.core.grant(
                    name.id.clone(),
                    name.key,
                    ttl,
                    owner,
                    token,
                    session,
                    lease_locker,
                    false,
                )?;
                answer.settle();
                Ok(Tried::Granted(lease))
            }
            Got::Refused => {
                answer.settle();
                Ok(Tried::Contended)
            }
        }
    }

    /// The wait on the server (`GET_LOCK(name, seconds)`), after the first
    /// attempt found the name held.
    async fn wait_on(
        &self,
        name: &LockName<'_>,
        ttl: Duration,
        on: WaitOn<Session>,
    ) -> Result<Lease> {
        let session = on.session.clone();
        let digest = owner_digest(&on.owner);
        let record = GrantRecord::new(name.key, ttl, self.settings.holder_record);
        let kill = KillQuery {
            pool: self.core.pool.clone(),
            query_timeout: self.settings.query_timeout,
        };
        let mut wait = WaitGuard::new(session.clone(), kill);
        let context = || format!("wait for {:?} on {}", name.key, self.settings.target);
        loop {
            let wait_for = on.remaining().min(MAX_WAIT);
            // The server ends the wait itself; this bound only catches a
            // server that stopped answering.
            let (sql, reading) = self.sql.acquire(name, &digest, wait_for, &record);
            let request = Request {
                sql,
                limit: wait_for.saturating_add(self.settings.query_timeout),
                undo: Some(Sql::undo(name)),
                keep: None,
                close_if_abandoned: true,
            };
            let answer = session
                .run(request)
                .await
                .map_err(|e| errors::backend("acquire", context(), e));
            let answer = match answer {
                Ok(answer) => answer,
                // The session closed itself (it failed or went silent).
                Err(e) => {
                    wait.disarm();
                    return Err(e);
                }
            };
            // Answered: the server is no longer waiting.
            let got = self.got(&answer, reading, &context);
            wait.disarm();
            match got? {
                Got::Granted(token) => {
                    let lease = self.core.grant(
                        name.id.clone(),
                        name.key,
                        ttl,
                        on.owner,
                        token,
                        session,
                        on.lease_locker,
                        false,
                    )?;
                    answer.settle();
                    return Ok(lease);
                }
                Got::Refused if on.remaining().is_zero() => {
                    answer.settle();
                    self.core.pool.recycle(session);
                    return Err(on.timed_out(name.key));
                }
                // A wait longer than a year: go on.
                Got::Refused => {
                    answer.settle();
                    wait.rearm(session.clone());
                }
            }
        }
    }

    /// Deletes the key's fencing row in one round trip, under a `GET_LOCK`
    /// that only a free name grants. The name is reserved first (see
    /// [`Core::reserve_to_forget`](crate::sql::core::Core::reserve_to_forget)).
    /// The reservation travels with the request and ends only once the
    /// statement (and, had it failed halfway, the release of its lock) has
    /// run.
    async fn forget(&self, name: &LockName<'_>) -> Result<()> {
        let reserved = self.core.reserve_to_forget(name.id.clone(), name.key)?;
        let session = self.core.pool.shared(&name.id).await?;
        let limit = self.settings.query_timeout;
        let request = Request {
            sql: self.sql.forget(name),
            limit,
            undo: Some(Sql::undo(name)),
            keep: Some(Box::new(reserved)),
            close_if_abandoned: false,
        };
        let context = || format!("forget {:?} on {}", name.key, self.settings.target);
        let answer = session.ask(request, "forget", &context).await?;
        let free = answer.int_in(0, "forget", &context)?;
        answer.settle();
        match free {
            Some(1) => Ok(()),
            Some(_) => Err(Error::NotAcquired {
                key: name.key.to_owned(),
            }),
            None => Err(errors::malformed(
                "forget",
                context,
                "GET_LOCK returned NULL (the statement was killed, or the server failed)",
            )),
        }
    }

    /// One upsert on the marks table (`distlock_marks`, beside the fencing
    /// table) on the name's shared session, after creating the table on
    /// this locker's first call; the mark's row is keyed by the name's
    /// [`lock_name`](super::lock_name). A lost answer leaves the outcome
    /// unknown.
    async fn advance_mark(&self, name: &LockName<'_>, value: i64) -> Result<MarkAdvance> {
        if !self.marks_ready.load(Ordering::Acquire) {
            super::pool::ensure_marks_table(&self.core.pool).await?;
            self.marks_ready.store(true, Ordering::Release);
        }
        let session = self.core.pool.shared(&name.id).await?;
        let timeout = self.settings.query_timeout;
        let context = || format!("advance the mark {:?} on {}", name.key, self.core.target);
        let table = FencingTable::marks_beside(self.settings.fencing.as_ref());
        let sql = advance_sql(&table, name, value);
        let answer = session
            .ask(Request::new(sql, timeout), "advance_mark", &context)
            .await
            // The statement may have committed before its answer was lost.
            .map_err(Error::with_outcome_unknown)?;
        let previous = answer.int_in(0, "advance_mark", &context)?;
        answer.settle();
        Ok(match previous {
            None => MarkAdvance::Advanced { previous: None },
            Some(previous) if previous < value => MarkAdvance::Advanced {
                previous: Some(previous),
            },
            Some(current) => MarkAdvance::AlreadyAt { current },
        })
    }

    /// The fencing rows whose key starts with `prefix` and whose name is
    /// held (`IS_USED_LOCK`): one scan of the table. Locks without a row
    /// (plain `GET_LOCK`, or no fencing) are not listed; without fencing
    /// this is [`Error::Unsupported`].
    async fn list(&self, prefix: &str, ours: Ours<'_, String>) -> Result<Vec<HeldLock>> {
        let Some(sql) = self.sql.list(prefix) else {
            return Err(Error::unsupported(
                BACKEND,
                "list",
                "without the fencing table (fencing=off) no lock records its key, so held \
                         locks cannot be listed; inspect a key instead",
            ));
        };
        let context = || format!("list locks under {prefix:?} on {}", self.settings.target);
        let rows = self.read("", sql, "list", &context).await?;
        let mut listed = Vec::with_capacity(rows.len());
        let bad = |why| errors::malformed("list", context, why);
        for row in &rows {
            let hold = read_hold(row, None).map_err(bad)?;
            // Released between the scan's IS_USED_LOCK and here: not listed.
            let Some((_, held)) = hold else { continue };
            // A table shared by several namespaces (fencing_table=schema.table)
            // has rows of other namespaces' locks of the same key.
            let name: Option<String> = column(row, LIST_NAME_COLUMN).map_err(bad)?;
            if name.is_some_and(|name| ours(&held.key, &name)) {
                listed.push(held);
            }
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    /// One statement: `IS_USED_LOCK` of the key's name joined with its
    /// fencing row (see the [module docs](super#inspection)).
    async fn find_hold(
        &self,
        name: &LockName<'_>,
        operation: &'static str,
    ) -> Result<Option<(u64, HeldLock)>> {
        let context = || format!("inspect {:?} on {}", name.key, self.settings.target);
        let rows = self
            .read(&name.id, self.sql.inspect(name), operation, &context)
            .await?;
        let bad = |why| errors::malformed(operation, context, why);
        let row = rows
            .first()
            .ok_or_else(|| bad("the server returned no row".into()))?;
        read_hold(row, Some(name.key)).map_err(bad)
    }

    /// `KILL`s `connection` if it still holds `name`, which frees **every**
    /// lock it holds, then waits until the server has freed the lock: true
    /// if it did, false if the connection no longer held it.
    async fn end_holder(&self, name: &LockName<'_>, connection: u64) -> Result<bool> {
        let session = self.core.pool.shared(&name.id).await?;
        if u64::from(session.connection_id) == connection {
            return Err(Error::unsupported(
                BACKEND,
                "force_release",
                format!(
                    "{:?} is held by this locker's own connection {connection}; release its lease, \
                     or force-release it from another client",
                    name.key
                ),
            ));
        }
        let context = || {
            format!(
                "KILL connection {connection}, which holds {:?}, on {} (killing another user's \
                 connection needs the CONNECTION_ADMIN or SUPER privilege)",
                name.key, self.settings.target
            )
        };
        // One integer answer of a statement on the name's shared session.
        let ask = |sql| async {
            let rows = self.read(&name.id, sql, "force_release", &context).await?;
            let bad = |why| errors::malformed("force_release", context, why);
            let row = rows
                .first()
                .ok_or_else(|| bad("the server returned no row".into()))?;
            column::<i64>(row, 0).map_err(bad)
        };
        if ask(Sql::kill_holder(name, connection)).await? != Some(1) {
            return Ok(false);
        }
        // The killed thread frees its locks as it ends, a moment later.
        let started = Instant::now();
        loop {
            if ask(Sql::held_by(name, connection)).await? != Some(1) {
                return Ok(true);
            }
            if started.elapsed() >= KILL_WAIT {
                return Err(Error::backend(
                    BACKEND,
                    "force_release",
                    format!(
                        "connection {connection} holding {:?} was killed but still held it after \
                         {KILL_WAIT:?}; inspect it again",
                        name.key
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn unlock(&self, on: On<'_, Self>, clear_record: bool) -> Result<bool> {
        let sql = if clear_record {
            self.sql.release(on.id)
        } else {
            Sql::release_only(on.id)
        };
        let answer = self.ask_on(on, sql, "release").await?;
        let released = answer.int_in(0, "release", on.context)?;
        answer.settle();
        // 0: another session holds it; NULL: nobody does. Either way this
        // session lost it (a `RELEASE_LOCK` or `RELEASE_ALL_LOCKS()` run on
        // it by hand?).
        Ok(released == Some(1))
    }

    async fn holder(&self, on: On<'_, Self>, owner: &str) -> Result<HolderAnswer> {
        let sql = self.sql.holder(on.id, &owner_digest(owner));
        let answer = self.ask_on(on, sql, "release").await?;
        let holder = answer.int_in(0, "release", on.context)?;
        let same_owner = answer.int_in(1, "release", on.context)?;
        answer.settle();
        let holder = holder.map(|id| (format!("connection {id}"), format!("KILL {id}")));
        // Without fencing the holder's row, if any, says nothing of its owner.
        Ok((holder, self.sql.fencing().then_some(same_owner == Some(1))))
    }

    async fn holds(&self, on: On<'_, Self>) -> Result<bool> {
        let answer = self.ask_on(on, Sql::holds(on.id), "refresh").await?;
        let holds = answer.int_in(0, "refresh", on.context)?;
        answer.settle();
        Ok(holds == Some(1))
    }

    /// Asks, in one statement, which of the names the session still holds
    /// (a session runs its statements in turn).
    fn held_among<'s>(
        &'s self,
        session: Arc<Session>,
        servers: &[&String],
    ) -> impl Future<Output = Result<Vec<bool>>> + Send + use<'s> {
        let sql = Sql::holds_many(servers.iter().map(|server| server.as_str()));
        let count = servers.len();
        async move {
            let target = &self.settings.target;
            let context = || format!("verify {count} held locks on {target}");
            let limit = self.settings.query_timeout;
            let answer = session
                .ask(Request::new(sql, limit), "refresh", &context)
                .await?;
            let held = (0..count)
                .map(|column| Ok(answer.int_in(column, "refresh", &context)? == Some(1)))
                .collect::<Result<Vec<bool>>>()?;
            answer.settle();
            Ok(held)
        }
    }
}

impl Inner {
    /// Sends `sql` on the session `on` names, bounded by the query timeout:
    /// how the release and verify statements are all asked.
    async fn ask_on(
        &self,
        on: On<'_, Self>,
        sql: String,
        operation: &'static str,
    ) -> Result<Answer> {
        let request = Request::new(sql, self.settings.query_timeout);
        on.session.ask(request, operation, on.context).await
    }
}
