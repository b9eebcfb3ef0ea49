//! Durable marks ([`crate::Locker::advance_mark`]): one row per mark in a
//! table beside the fencing table, raised by one upsert.

use std::sync::atomic::Ordering;

use super::errors::{self, is_concurrent_create};
use super::fencing::FencingTable;
use super::keys::LockKey;
use super::Inner;
use crate::deadline::bounded;
use crate::{Error, MarkAdvance, Result};

/// The statements on the marks table, built once per locker.
#[derive(Debug, Clone)]
pub(super) struct MarksSql {
    create: String,
    /// `$1` the mark's key (hashed like a lock key), `$2` the value, `$3`
    /// the caller's name (kept for operators reading the table). Returns the
    /// stored mark and the mark before this statement (NULL if it inserted
    /// the row), and no row when the mark already was at or past `$2`.
    ///
    /// The conflict arm runs under the row lock the upsert takes, on the
    /// latest committed row, so `previous` is the value this statement
    /// replaced even when a concurrent upsert committed first (a CTE reading
    /// the old row would see the statement's snapshot instead, which a
    /// racing writer may have already moved past). A mark that does not
    /// advance is not rewritten: the scheduler peeks at marks on every tick.
    advance: String,
    /// `$1` the mark's key: the stored mark. Read after an advance that
    /// changed nothing; marks only grow, so it is at or past that value.
    current: String,
}

impl MarksSql {
    pub(super) fn new(fencing: Option<&FencingTable>) -> Self {
        let table = FencingTable::marks_beside(fencing).quoted();
        MarksSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                    mark_key bigint PRIMARY KEY, \
                    mark bigint NOT NULL, \
                    previous bigint, \
                    name text NOT NULL, \
                    updated_at timestamptz NOT NULL DEFAULT now())"
            ),
            advance: format!(
                "INSERT INTO {table} AS m (mark_key, mark, previous, name) \
                 VALUES ($1::int8, $2::int8, NULL, $3::text) \
                 ON CONFLICT (mark_key) DO UPDATE SET previous = m.mark, \
                 mark = EXCLUDED.mark, updated_at = now() \
                 WHERE m.mark < EXCLUDED.mark \
                 RETURNING mark, previous"
            ),
            current: format!("SELECT mark FROM {table} WHERE mark_key = $1::int8"),
        }
    }
}

impl Inner {
    /// [`crate::Locker::advance_mark`] for string and raw keys alike: one
    /// statement on the key's shared session, after creating the table on
    /// this locker's first call.
    pub(super) async fn advance_mark(&self, lock: LockKey<'_>, value: i64) -> Result<MarkAdvance> {
        let session = self.core.pool.shared(&lock.id).await?;
        let timeout = self.settings.query_timeout;
        let context = || {
            format!(
                "advance the mark {:?} on {}",
                lock.key, self.settings.target
            )
        };
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
}
