//! Who holds a lock: `IS_USED_LOCK` (which connection holds the name)
//! joined with the lock's fencing row (what the grant recorded), and
//! operator release by `KILL` of the holding connection.
//!
//! The row is the current holder's record only if the connection that
//! wrote it is the one holding the name now (`session_id`): a row left by an
//! earlier holder beside a plain `GET_LOCK` describes nobody.

use std::time::Duration;

use mysql_async::Row;

use super::session::Request;
use super::Inner;
use crate::inspect::{self, Clock, GrantTime, HeldLock, Holder};
use crate::sql::dialect::Context;
use crate::Result;

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
}
