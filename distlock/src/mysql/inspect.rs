//! Who holds a lock: `IS_USED_LOCK` (which connection holds the name)
//! joined with the lock's fencing row (what the grant recorded), and
//! operator release by `KILL` of the holding connection.
//!
//! The row is the current holder's record only if the connection that
//! wrote it is the one holding the name now (`session_id`): a row left by an
//! earlier holder beside a plain `GET_LOCK` describes nobody.

use std::time::Duration;

use mysql_async::Row;
use tokio::time::Instant;

use super::errors::{self, BACKEND};
use super::fencing::Sql;
use super::names::LockName;
use super::session::Request;
use super::Inner;
use crate::inspect::{self, Clock, GrantTime, HeldLock, Holder};
use crate::sql::dialect::Context;
use crate::{Error, Result};

/// How long a force release waits for the killed connection's locks to be
/// freed (the server ends the killed thread asynchronously).
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The column of [`Sql::list`]'s answer that names the lock.
pub(super) const LIST_NAME_COLUMN: usize = 9;

/// A column as `T`, `None` for NULL.
pub(super) fn column<T: mysql_async::prelude::FromValue>(
    row: &Row,
    index: usize,
) -> Result<Option<T>, String> {
    match row.get_opt::<Option<T>, usize>(index) {
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(format!("column {index}: {e}")),
        None => Err(format!("the answer has no column {index}")),
    }
}

/// Reads a row of [`Sql::inspect`] or [`Sql::list`]: the holding connection
/// (`None`: free) and what is known of the hold. `key` names the lock in the
/// report (the recorded name for a listing).
pub(super) fn read_hold(row: &Row, key: Option<&str>) -> Result<Option<(u64, HeldLock)>, String> {
    let Some(connection) = column::<u64>(row, 0)? else {
        return Ok(None);
    };
    let key_name: Option<String> = column(row, 8)?;
    let Some(name) = key.map(str::to_owned).or(key_name) else {
        return Ok(None);
    };
    let mut held = HeldLock::new(name);
    held.session = Some(format!("connection {connection}"));
    // A row written by another connection describes an earlier grant.
    if column::<u64>(row, 1)? == Some(connection) {
        let token: Option<u64> = column(row, 2)?;
        let granted_ms: Option<u64> = column(row, 3)?;
        let ttl_ms: Option<u64> = column(row, 4)?;
        let host: Option<String> = column(row, 5)?;
        let holder_pid: Option<u32> = column(row, 6)?;
        let label: Option<String> = column(row, 7)?;
        held.fencing_token = token;
        held.granted = granted_ms.map(|ms| GrantTime {
            at: inspect::from_unix_millis(ms),
            clock: Clock::Server,
        });
        held.ttl = ttl_ms.map(Duration::from_millis);
        held.holder = match (host, holder_pid, label) {
            (Some(host), Some(pid), Some(label)) => Some(Holder { host, pid, label }),
            _ => None,
        };
    }
    Ok(Some((connection, held)))
}

impl Inner {
    /// Runs one read-only statement on `name`'s shared session.
    pub(super) async fn read(
        &self,
        session_key: &str,
        sql: String,
        operation: &'static str,
        context: Context<'_>,
    ) -> Result<Vec<Row>> {
        let session = self.core.pool.shared(session_key).await?;
        let limit = self.settings.query_timeout;
        let mut answer = session
            .ask(Request::new(sql, limit), operation, context)
            .await?;
        let rows = std::mem::take(&mut answer.rows);
        answer.settle();
        Ok(rows)
    }

    pub(super) async fn find_hold(
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

    /// `KILL`s `connection` if it still holds `name`, then waits until the
    /// server has freed the lock: true if it did, false if the connection no
    /// longer held it.
    pub(super) async fn kill(&self, name: &LockName<'_>, connection: u64) -> Result<bool> {
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
}
