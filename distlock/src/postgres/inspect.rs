//! Who holds a lock: `pg_locks` (which session holds the advisory key)
//! joined with the key's fencing row (what the grant recorded), and operator
//! release by ending the holding session.
//!
//! The row is the current holder's record only if the session that wrote it
//! is the one holding the key now (`session_pid`): a row left by an earlier
//! holder beside a lock taken with plain `pg_advisory_lock` describes
//! nobody, so that lock is reported as held by an unknown holder.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use super::errors::{self, BACKEND};
use super::keys::LockKey;
use super::Inner;
use crate::inspect::{Clock, ForceRelease, GrantTime, HeldLock, Holder};
use crate::sql::dialect::Dialect;
use crate::{Error, Result};

/// How long `pg_terminate_backend` waits for the terminated backend to exit
/// (and so free its locks) before it reports failure (Postgres 14+).
const TERMINATE_WAIT: Duration = Duration::from_secs(5);

/// One hold found in `pg_locks`, with its fencing row (see
/// [`Sql::inspect`](super::fencing::Sql)).
struct Hold {
    pid: i32,
    lock_key: Option<i64>,
    key_name: Option<String>,
    held: HeldLock,
}

impl Hold {
    /// Reads a row of [`Sql::inspect`](super::fencing::Sql) or
    /// [`Sql::list`](super::fencing::Sql); `key` names the lock in the
    /// report (the recorded name for a listing).
    fn from_row(row: &Row, key: Option<&str>) -> Result<Hold, tokio_postgres::Error> {
        let pid: i32 = row.try_get(0)?;
        let session_pid: Option<i32> = row.try_get(1)?;
        let key_name: Option<String> = row.try_get(8)?;
        let lock_key: Option<i64> = row.try_get(9)?;
        let name = key.or(key_name.as_deref()).unwrap_or_default();
        let mut held = HeldLock::new(name);
        held.session = Some(format!("pid {pid}"));
        // A row written by another session than the holder's describes an
        // earlier grant, not this one.
        if session_pid == Some(pid) {
            let token: Option<i64> = row.try_get(2)?;
            let granted: Option<SystemTime> = row.try_get(3)?;
            let ttl_ms: Option<i64> = row.try_get(4)?;
            let host: Option<String> = row.try_get(5)?;
            let holder_pid: Option<i64> = row.try_get(6)?;
            let label: Option<String> = row.try_get(7)?;
            held.fencing_token = token.and_then(|t| u64::try_from(t).ok());
            held.granted = granted.map(|at| GrantTime {
                at,
                clock: Clock::Server,
            });
            held.ttl = ttl_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis);
            held.holder = match (host, holder_pid.and_then(|p| u32::try_from(p).ok()), label) {
                (Some(host), Some(pid), Some(label)) => Some(Holder { host, pid, label }),
                _ => None,
            };
        }
        Ok(Hold {
            pid,
            lock_key,
            key_name,
            held,
        })
    }
}

impl Inner {
    /// [`crate::Locker::inspect`] for string and raw keys alike.
    pub(super) async fn inspect(&self, lock: LockKey<'_>) -> Result<Option<HeldLock>> {
        Ok(self.find_hold(lock, "inspect").await?.map(|hold| hold.held))
    }

    async fn find_hold(&self, lock: LockKey<'_>, operation: &'static str) -> Result<Option<Hold>> {
        let session = self.core.pool.shared(&lock.id).await?;
        let context = || format!("inspect {:?} on {}", lock.key, self.settings.target);
        let rows = errors::within(
            operation,
            self.settings.query_timeout,
            context,
            session.query(&self.sql.inspect, &[&lock.id]),
        )
        .await?;
        // Several rows only for a key held in shared mode
        // (`pg_advisory_lock_shared`, never distlock): report the first.
        rows.first()
            .map(|row| Hold::from_row(row, Some(lock.key)))
            .transpose()
            .map_err(|e| errors::backend(operation, context(), e))
    }

    /// [`crate::Locker::list`]: the held keys whose recorded name starts with
    /// `prefix` and that `ours` says this locker would lock under that name
    /// (string keys in its namespace, or raw keys), sorted by name.
    pub(super) async fn list(
        &self,
        prefix: &str,
        ours: impl Fn(&str, i64) -> bool,
    ) -> Result<Vec<HeldLock>> {
        if !self.fencing() {
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
                if ours(name, lock_key) {
                    listed.push(hold.held);
                }
            }
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    /// [`crate::Locker::force_release`]: only by ending the holding session.
    pub(super) async fn force_release(
        &self,
        lock: LockKey<'_>,
        how: ForceRelease,
    ) -> Result<Option<HeldLock>> {
        let find = || async {
            let hold = self.find_hold(lock, "force_release").await?;
            Ok(hold.map(|hold| (hold.pid, hold.held)))
        };
        let end = |pid| self.terminate(lock, pid);
        let core = &self.core;
        core.force_release(lock.key, how, Self::TERMINATION, find, end)
            .await
    }

    /// Ends server process `pid` if it still holds `key`, waiting for it to
    /// exit: true if it did, false if it no longer held the key.
    async fn terminate(&self, lock: LockKey<'_>, pid: i32) -> Result<bool> {
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
}
