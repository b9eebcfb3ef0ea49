//! Errors from tokio-postgres, made readable.
//!
//! tokio-postgres' `Display` says only "db error" for anything the server
//! reported and leaves the server's message to `source()`, which most callers
//! never print. Every error this backend returns names what it was doing and
//! carries the server's severity, SQLSTATE and message in its own text.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::deadline::bounded;
use crate::Error;

pub(super) const BACKEND: &str = "postgres";

/// A tokio-postgres error and what the backend was doing when it happened.
#[derive(Debug)]
pub(super) struct PgError {
    context: String,
    source: tokio_postgres::Error,
    /// What to do about it, when the backend knows (after the server's
    /// words).
    next_step: Option<String>,
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.context, describe(&self.source))?;
        match &self.next_step {
            Some(next_step) => write!(f, "; {next_step}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The error's own words plus what tokio-postgres keeps in its source: the
/// server's report, or the I/O or TLS failure underneath.
pub(super) fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" ({detail})"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        return text;
    }
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        text.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    text
}

/// [`Error::Backend`] for a tokio-postgres failure during `operation`.
pub(super) fn backend(
    operation: &'static str,
    context: impl Into<String>,
    source: tokio_postgres::Error,
) -> Error {
    pg_error(operation, context.into(), source, None)
}

/// [`backend`], with what to do about it (`next_step`) after the
/// server's words.
pub(super) fn backend_with_next_step(
    operation: &'static str,
    context: impl Into<String>,
    source: tokio_postgres::Error,
    next_step: String,
) -> Error {
    pg_error(operation, context.into(), source, Some(next_step))
}

fn pg_error(
    operation: &'static str,
    context: String,
    source: tokio_postgres::Error,
    next_step: Option<String>,
) -> Error {
    let error = PgError {
        context,
        source,
        next_step,
    };
    Error::backend(BACKEND, operation, error)
}

/// True for SQLSTATE 42501 (insufficient_privilege): the role may not do
/// this, such as create a table in a schema without `CREATE` on it.
pub(super) fn is_insufficient_privilege(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
}

/// Runs one statement (or a few pipelined ones) of `operation`, bounded by
/// `limit`: a failure becomes [`Error::Backend`] naming `context()`, no
/// answer within `limit` becomes [`Error::DeadlineExceeded`]. Dropping
/// `call` must be safe at any await point: the callers' guards make it so.
pub(super) async fn within<T>(
    operation: &'static str,
    limit: Duration,
    context: impl FnOnce() -> String,
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> crate::Result<T> {
    bounded(BACKEND, operation, limit, async {
        call.await.map_err(|e| backend(operation, context(), e))
    })
    .await
}

/// True for `lock_timeout` expiring (SQLSTATE 55P03, lock_not_available).
pub(super) fn is_lock_timeout(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
}

/// True when a `CREATE TABLE IF NOT EXISTS` lost a race with another session
/// creating the same table (Postgres reports the loser's insert into its
/// catalog as a unique violation, a duplicate table, or, when the row type
/// collides first, `type "…" already exists`: a duplicate object).
pub(super) fn is_concurrent_create(error: &tokio_postgres::Error) -> bool {
    matches!(
        error.code(),
        Some(code) if *code == SqlState::UNIQUE_VIOLATION
            || *code == SqlState::DUPLICATE_TABLE
            || *code == SqlState::DUPLICATE_OBJECT
    )
}
