//! Transaction-scoped advisory locks, for connections that go through a
//! transaction-mode pooler (PgBouncer `pool_mode = transaction`, RDS Proxy,
//! Supavisor) where session locks are unsafe.
//!
//! The lock is taken inside *your* transaction and released by the server at
//! its `COMMIT` or `ROLLBACK`; there is nothing to release and nothing can
//! leak. A pooler never moves a transaction between server sessions, so this
//! is safe where session locks are not. The price: the lock lasts exactly as
//! long as the transaction, so the guarded work must be done in it.
//!
//! Keys are the same 64-bit keys as the session locks of
//! [`PostgresLocker`](super::PostgresLocker) (use
//! [`advisory_key`](super::advisory_key) for strings), and the two exclude
//! each other. Shared (reader) locks work here too
//! ([`try_lock_shared_xact`], [`lock_shared_xact`]): they exclude exclusive
//! locks of either kind and coexist with shared ones of either kind, as the
//! session locker's shared leases do, and a waiting exclusive request holds
//! later ones back as it does there.

use tokio_postgres::Transaction;

use super::errors;
use crate::Result;

/// Takes advisory `key` until the end of `transaction` if it is free
/// (`pg_try_advisory_xact_lock`): `true` if taken, `false` if held elsewhere.
///
/// Taking a key the transaction already holds succeeds again (the lock is
/// re-entrant within a transaction).
///
/// ```no_run
/// use distlock::postgres::{advisory_key, try_lock_xact};
///
/// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = client.transaction().await?;
/// if try_lock_xact(&tx, advisory_key("", "nightly-report")).await? {
///     tx.execute("UPDATE reports SET state = 'running' WHERE day = current_date", &[]).await?;
/// }
/// tx.commit().await?; // releases the lock
/// # Ok(())
/// # }
/// ```
pub async fn try_lock_xact(transaction: &Transaction<'_>, key: i64) -> Result<bool> {
    try_xact(transaction, key, false).await
}

/// Waits until advisory `key` is free, then holds it until the end of
/// `transaction` (`pg_advisory_xact_lock`).
///
/// The wait is bounded only by the transaction's own `lock_timeout` or
/// `statement_timeout`; set one first (`SET LOCAL lock_timeout = '5s'`), and
/// expect SQLSTATE 55P03 when it runs out. Cancelling this future does not
/// stop the wait on the server: roll the transaction back.
pub async fn lock_xact(transaction: &Transaction<'_>, key: i64) -> Result<()> {
    wait_xact(transaction, key, false).await
}

/// Takes advisory `key` **shared** until the end of `transaction`
/// (`pg_try_advisory_xact_lock_shared`): `true` if taken, `false` if it is
/// held exclusively, or an exclusive request waits for it (the server
/// queues later shared requests behind a waiting one). Shared holders, of
/// transactions or of [`PostgresLocker`](super::PostgresLocker)'s
/// [`try_lock_shared`](crate::Locker::try_lock_shared), coexist.
///
/// Nothing is written: a shared lock here carries no fencing token (read
/// the key's row in the fencing table yourself if you need the last
/// writer's).
///
/// # Errors
///
/// [`Error::Backend`](crate::Error::Backend) with the server's error (the
/// transaction is then aborted, and its locks go with its rollback).
///
/// # Cancel safety
///
/// Dropping the future may leave the lock taken, until the transaction
/// ends: roll it back.
///
/// ```no_run
/// use distlock::postgres::{advisory_key, try_lock_shared_xact};
///
/// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = client.transaction().await?;
/// if try_lock_shared_xact(&tx, advisory_key("", "catalog")).await? {
///     let rows = tx.query("SELECT * FROM catalog", &[]).await?;
///     # let _ = rows;
/// }
/// tx.commit().await?; // releases the lock
/// # Ok(())
/// # }
/// ```
pub async fn try_lock_shared_xact(transaction: &Transaction<'_>, key: i64) -> Result<bool> {
    try_xact(transaction, key, true).await
}

/// Waits until advisory `key` can be held shared, then holds it until the
/// end of `transaction` (`pg_advisory_xact_lock_shared`); it waits behind
/// an exclusive request queued before it.
///
/// The wait is bounded only by the transaction's own `lock_timeout` or
/// `statement_timeout`, as for [`lock_xact`].
///
/// # Errors
///
/// [`Error::Backend`](crate::Error::Backend) with the server's error
/// (SQLSTATE 55P03 when the transaction's `lock_timeout` runs out).
///
/// # Cancel safety
///
/// Cancelling this future does not stop the wait on the server: roll the
/// transaction back.
pub async fn lock_shared_xact(transaction: &Transaction<'_>, key: i64) -> Result<()> {
    wait_xact(transaction, key, true).await
}

/// `" shared"` in the error texts of a shared attempt, nothing otherwise.
fn shared_text(shared: bool) -> &'static str {
    if shared {
        " shared"
    } else {
        ""
    }
}

/// The one try of [`try_lock_xact`] (or, `shared`, [`try_lock_shared_xact`]):
/// whether `transaction` now holds `key`.
async fn try_xact(transaction: &Transaction<'_>, key: i64, shared: bool) -> Result<bool> {
    let sql = if shared {
        "SELECT pg_try_advisory_xact_lock_shared($1::int8)"
    } else {
        "SELECT pg_try_advisory_xact_lock($1::int8)"
    };
    transaction
        .query_one(sql, &[&key])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| {
            let shared = shared_text(shared);
            let doing = format!("try advisory key {key}{shared} for this transaction");
            errors::backend("acquire", doing, e)
        })
}

/// The wait of [`lock_xact`] (or, `shared`, [`lock_shared_xact`]) until
/// `transaction` holds `key`.
async fn wait_xact(transaction: &Transaction<'_>, key: i64, shared: bool) -> Result<()> {
    let sql = if shared {
        "SELECT pg_advisory_xact_lock_shared($1::int8)"
    } else {
        "SELECT pg_advisory_xact_lock($1::int8)"
    };
    transaction
        .execute(sql, &[&key])
        .await
        .map(drop)
        .map_err(|e| {
            let shared = shared_text(shared);
            let doing = format!("wait for advisory key {key}{shared} in this transaction");
            errors::backend("acquire", doing, e)
        })
}
