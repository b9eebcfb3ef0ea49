//! Who holds a lock: `pg_locks` (which session holds the advisory key)
//! joined with the key's fencing row (what the grant recorded), and operator
//! release by ending the holding session.
//!
//! The row is the current holder's record only if the session that wrote it
//! is the one holding the key now (`session_pid`): a row left by an earlier
//! holder beside a lock taken with plain `pg_advisory_lock` describes
//! nobody, so that lock is reported as held by an unknown holder.
//!
//! A key held shared (`pg_locks.mode = 'ShareLock'`) is reported
//! [`HeldLock::shared`], by unknown holders: readers write no record (the
//! row, if any, is the last writer's), so only the token they carry (the
//! row's counter) and one reader's session are known.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use crate::inspect::{Clock, GrantTime, HeldLock, Holder};
use crate::Result;

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
        let shared: bool = row.try_get(10)?;
        let name = key.or(key_name.as_deref()).unwrap_or_default();
        let mut held = HeldLock::new(name);
        held.session = Some(format!("pid {pid}"));
        held.shared = shared;
        if shared {
            // Readers record nothing: the row is the last writer's, and only
            // its counter, the token every reader carries, is theirs.
            let reader_token: Option<i64> = row.try_get(11)?;
            held.fencing_token = reader_token.and_then(|t| u64::try_from(t).ok());
        } else if session_pid == Some(pid) {
            // A row written by another session than the holder's describes
            // an earlier grant, not this one.
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
