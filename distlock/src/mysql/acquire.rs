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
use super::fencing::{Sql, MAX_WAIT};
use super::names::{owner_digest, LockName};
use super::pool::Pool;
use super::pool::{Registry, Ticket};
use super::session::{Answer, Request, Session};
use super::Inner;
use crate::deadline::bounded;
use crate::inspect::GrantRecord;
use crate::session_registry::Busy;
use crate::sql::core::{AbandonWait, Reserved, Tried, WaitGuard, WaitOn};
use crate::sql::dialect::Context;
use crate::{new_owner_token, Error, Lease, Locker, Result};

/// What `GET_LOCK` answered.
enum Got {
    Granted(Option<u64>),
    /// 0: held elsewhere (or, for a wait, still held when it timed out).
    Refused,
}

impl Inner {
    /// One attempt on the name's shared session; a grant is recorded.
    pub(super) async fn try_once(
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
        let request = Request {
            sql: self.sql.acquire(name, &digest, Duration::ZERO, &record),
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
        match self.got(&answer, &context)? {
            Got::Granted(token) => {
                let lease = self.core.grant(
                    name.id.clone(),
                    name.key,
                    ttl,
                    owner,
                    token,
                    session,
                    lease_locker,
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

    /// Reads `GET_LOCK`'s answer. An error leaves `answer` unsettled: its
    /// undo then releases whatever the statement took.
    fn got(&self, answer: &Answer, context: Context<'_>) -> Result<Got> {
        let bad = |why: String| errors::malformed("acquire", context, why);
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

    /// The wait on the server (`GET_LOCK(name, seconds)`), after the first
    /// attempt found the name held.
    pub(super) async fn wait_on(
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
            let request = Request {
                sql: self.sql.acquire(name, &digest, wait_for, &record),
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
            let got = self.got(&answer, &context);
            wait.disarm();
            match got? {
                Got::Granted(token) => {
                    let WaitOn {
                        owner,
                        lease_locker,
                        ..
                    } = on;
                    let id = name.id.clone();
                    let lease =
                        self.core
                            .grant(id, name.key, ttl, owner, token, session, lease_locker)?;
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
}

/// The caller's side of an attempt: dropped after the request was queued
/// but before its answer arrived, it marks the reservation as cleaning up,
/// so callers meanwhile are told the truth (unknown), not "contention".
struct Attempt {
    registry: Arc<Registry>,
    ticket: Ticket,
    /// Until the request is queued.
    reserved: Option<Reserved<String, Session>>,
    answered: bool,
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
struct KillQuery {
    pool: Arc<Pool>,
    query_timeout: Duration,
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
