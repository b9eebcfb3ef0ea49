//! Taking a lock: one attempt on the name's shared session, or a native
//! wait (`GET_LOCK(name, seconds)`) on a connection of its own, or, when
//! `max_waiters` such connections are already open, polling on the shared
//! session.
//!
//! Both are cancel-safe. The session's actor runs every statement to its
//! end whoever still waits for it; an attempt whose answer nobody takes
//! (the caller dropped the future, its bound passed, the grant could not be
//! recorded) is released by the actor on the same connection, before the
//! key's reservation ends, so no other attempt of this locker can slip in
//! between. A native wait abandoned while the server is still waiting is
//! ended on the server with `KILL QUERY` and its connection closed, so
//! nothing is granted to a waiter nobody listens to.

use std::sync::Arc;
use std::time::Duration;

use super::errors::{self, BACKEND};
use super::fencing::Reading;
use super::pool::Pool;
use super::pool::{Registry, Ticket};
use super::session::{Answer, Request, Session};
use super::Inner;
use crate::deadline::bounded;
use crate::sql::core::{AbandonWait, Reserved};
use crate::sql::dialect::Context;
use crate::Result;

/// What `GET_LOCK` answered.
pub(super) enum Got {
    Granted(Option<u64>),
    /// 0: held elsewhere (or, for a wait, still held when it timed out).
    Refused,
}

impl Inner {
    /// Reads an attempt's answer, where `reading` says it is. An error
    /// leaves `answer` unsettled: its undo then releases whatever the
    /// statement took.
    pub(super) fn got(
        &self,
        answer: &Answer,
        reading: Reading,
        context: Context<'_>,
    ) -> Result<Got> {
        let bad = |why: String| errors::malformed("acquire", context, why);
        if reading == Reading::Written {
            // The fenced upsert: 1 inserted, 2 bumped, 0 not taken.
            let written = answer.written;
            return match (written.affected_rows, written.last_insert_id) {
                (0, _) => Ok(Got::Refused),
                (1 | 2, Some(token)) => Ok(Got::Granted(Some(token))),
                (1 | 2, None) => Err(bad("the grant returned no fencing token".into())),
                (rows, _) => Err(bad(format!("the grant wrote {rows} rows"))),
            };
        }
        match answer.int(0).map_err(bad)? {
            Some(1) => {
                let token = answer.int(1).map_err(bad)?;
                let token = match (self.sql.fencing(), token) {
                    (false, _) => None,
                    (true, Some(token)) => Some(u64::try_from(token).map_err(|_| {
                        bad(format!(
                            "the fencing counter is negative ({token}); was the table edited?"
                        ))
                    })?),
                    (true, None) => return Err(bad("the server returned no fencing token".into())),
                };
                Ok(Got::Granted(token))
            }
            Some(0) => Ok(Got::Refused),
            Some(other) => Err(bad(format!("GET_LOCK returned {other}"))),
            // MySQL's documented error answer; a `KILL QUERY` of the
            // statement gives it too. Never contention.
            None => Err(bad(
                "GET_LOCK returned NULL: the statement was killed (KILL QUERY) or the server failed".into(),
            )),
        }
    }
}

/// The caller's side of an attempt: dropped after the request was queued
/// but before its answer arrived, it marks the reservation as cleaning up,
/// so callers meanwhile are told the truth (unknown), not "contention".
pub(super) struct Attempt {
    pub(super) registry: Arc<Registry>,
    pub(super) ticket: Ticket,
    /// Until the request is queued.
    pub(super) reserved: Option<Reserved<String, Session>>,
    pub(super) answered: bool,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.reserved.is_none() && !self.answered {
            self.registry.cleaning_up(self.ticket.clone());
        }
    }
}

/// How an abandoned native wait ends: `KILL QUERY` on the server, through a
/// shared session; the waiter's actor closes its connection as soon as
/// nobody waits for the answer (and releases the lock had it been granted
/// first), so nothing stays granted to a waiter that is gone.
pub(super) struct KillQuery {
    pub(super) pool: Arc<Pool>,
    pub(super) query_timeout: Duration,
}

impl AbandonWait<Session> for KillQuery {
    fn abandon(&self, session: Arc<Session>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, limit) = (self.pool.clone(), self.query_timeout);
        let id = session.connection_id;
        runtime.spawn(async move {
            let kill = async {
                let shared = pool.shared("").await?;
                shared
                    .run(Request::new(format!("KILL QUERY {id}"), limit))
                    .await
                    .map(Answer::settle)
                    .map_err(|e| errors::backend("acquire", "kill an abandoned wait", e))
            };
            match bounded(BACKEND, "acquire", limit, kill).await {
                Ok(()) => {}
                // The wait had already ended (or the connection with it).
                Err(error) => tracing::debug!(
                    component = "distlock", backend = BACKEND, %error,
                    "KILL QUERY of an abandoned wait failed; closing its connection ends it when the server notices"
                ),
            }
            drop(session);
        });
    }
}
