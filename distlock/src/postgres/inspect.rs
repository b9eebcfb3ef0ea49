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
use crate::inspect::{Clock, GrantTime, HeldLock, Holder};
use crate::{Error, Result};

/// How long `pg_terminate_backend` waits for the terminated backend to exit
/// (and so free its locks) before it reports failure (Postgres 14+).
const TERMINATE_WAIT: Duration = Duration::from_secs(5);

/// One hold found in `pg_locks`, with its fencing row (see
/// [`Sql::inspect`](super::fencing::Sql)).
pub(super) struct Hold {
    pub(super) pid: i32,
    pub(super) lock_key: Option<i64>,
    pub(super) key_name: Option<String>,
    pub(super) held: HeldLock,
}

impl Hold {
    /// Reads a row of [`Sql::inspect`](super::fencing::Sql) or
    /// [`Sql::list`](super::fencing::Sql); `key` names the lock in the
    /// report (the recorded name for a listing).
    pub(super) fn from_row(row: &Row, key: Option<&str>) -> Result<Hold, tokio_postgres::Error> {
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
    pub(super) async fn find_hold(
        &self,
        lock: LockKey<'_>,
        operation: &'static str,
    ) -> Result<Option<Hold>> {
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

    /// Ends server process `pid` if it still holds `key`, waiting for it to
    /// exit: true if it did, false if it no longer held the key.
    pub(super) async fn terminate(&self, lock: LockKey<'_>, pid: i32) -> Result<bool> {
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
