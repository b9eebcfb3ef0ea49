//! Releasing and verifying held locks.

use super::errors::{self, BACKEND};
use super::fencing::Sql;
use super::names::{owner_digest, LockName};
use super::registry::Busy;
use super::session::{Request, Role};
use super::Inner;
use crate::deadline::bounded;
use crate::session_registry::Claim;
use crate::{validate, Error, LostReason, RefreshRequest, Result};

/// The most locks one statement of [`Inner::refresh_many`] asks about (a
/// column each): a statement of about 30 KB, far under the default
/// `max_allowed_packet` (16 MB on MariaDB 10.11, 64 MB on MySQL 8).
const HOLDS_PER_STATEMENT: usize = 256;

impl Inner {
    /// Releases `name` if `owner` holds it through this locker; otherwise
    /// says whether somebody else holds it under that owner.
    pub(super) async fn release(&self, name: LockName<'_>, owner: &str) -> Result<()> {
        let Some(held) = self.registry.take(&name.server, owner) else {
            return self.release_elsewhere(name, owner).await;
        };
        // The entry is gone before the release is queued, with no await in
        // between: an attempt on this name that now reserves it and reaches
        // the same session is queued after the release.
        let limit = self.settings.query_timeout;
        let context = || {
            format!(
                "release {:?} on {}; the server frees it when the session ends",
                name.key, self.settings.target
            )
        };
        let release = |sql: String| {
            let session = &held.session;
            bounded(BACKEND, "release", limit, async move {
                session
                    .run(Request::new(sql, limit))
                    .await
                    .map_err(|e| errors::backend("release", context(), e))
            })
        };
        let answer = match release(self.sql.release(&name)).await {
            Ok(answer) => answer,
            // The statement clears the row's holder record before it
            // releases; if that part failed (the row locked by another
            // client past `innodb_lock_wait_timeout`), `RELEASE_LOCK` never
            // ran, and the lock would stay on a live session for good.
            // Release alone.
            Err(error) => match release(Sql::release_only(&name)).await {
                Ok(answer) => {
                    tracing::warn!(
                        component = "distlock",
                        backend = BACKEND,
                        key = name.key,
                        %error,
                        "released the lock without clearing its holder record in the fencing row"
                    );
                    answer
                }
                Err(_) => return Err(error),
            },
        };
        let released = answer
            .int(0)
            .map_err(|why| Error::backend(BACKEND, "release", format!("{}: {why}", context())))?;
        answer.settle();
        if released == Some(1) {
            if held.session.role == Role::Waiter {
                self.pool.recycle(held.session);
            }
            return Ok(());
        }
        // 0: another session holds it; NULL: nobody does. Either way this
        // session lost it (the server freed it: a `RELEASE_LOCK` or
        // `RELEASE_ALL_LOCKS()` run on it by hand?).
        held.lost.notify(LostReason::NotHeld);
        Err(Error::NotHeld {
            key: name.key.to_owned(),
        })
    }

    /// A release of a lock this locker does not hold. It cannot release it
    /// (only the session holding a `GET_LOCK` can), but it can say which
    /// error applies: `Unsupported` if another client holds it under
    /// `owner`, `NotHeld` if nobody does.
    async fn release_elsewhere(&self, name: LockName<'_>, owner: &str) -> Result<()> {
        let not_held = || Error::NotHeld {
            key: name.key.to_owned(),
        };
        match self.registry.state(&name.server) {
            Some(Busy::Contended) => return Err(not_held()),
            Some(Busy::CleaningUp) => return Err(self.cleanup_pending(&name, "release")),
            None => {}
        }
        let session = self.pool.shared(&name.server).await?;
        let limit = self.settings.query_timeout;
        let context = || {
            format!(
                "look up the holder of {:?} on {}",
                name.key, self.settings.target
            )
        };
        let sql = self.sql.holder(&name, &owner_digest(owner));
        let answer = bounded(BACKEND, "release", limit, async {
            session
                .run(Request::new(sql, limit))
                .await
                .map_err(|e| errors::backend("release", context(), e))
        })
        .await?;
        let bad = |why: String| Error::backend(BACKEND, "release", format!("{}: {why}", context()));
        let (holder, same_owner) = (answer.int(0).map_err(bad)?, answer.int(1).map_err(bad)?);
        answer.settle();
        let Some(connection) = holder else {
            return Err(not_held());
        };
        let reason = match (self.sql.fencing(), same_owner) {
            (true, Some(1)) => format!(
                "{:?} is held under this owner token by another client (connection {connection}); a GET_LOCK \
                 lock can only be released by the session holding it: release it from that client, or end \
                 its session (KILL {connection}) to free it",
                name.key
            ),
            (true, _) => return Err(not_held()),
            (false, _) => format!(
                "{:?} is held by connection {connection}; without the fencing table this client cannot tell \
                 whether under this owner token, and only the session holding it can release it",
                name.key
            ),
        };
        Err(Error::Unsupported {
            backend: BACKEND,
            operation: "release",
            reason,
        })
    }

    /// [`Locker::refresh_many`](crate::Locker::refresh_many): on each
    /// session that holds some of the locks, one statement per
    /// [`HOLDS_PER_STATEMENT`] names (all sent at once; a session runs its
    /// statements in turn), each asking the server which of them the
    /// session still holds (see
    /// [`Registry::confirm_many`](crate::session_registry::Registry::confirm_many)).
    pub(super) async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let claims = requests
            .iter()
            .map(|request| {
                validate::acquire(request.key, request.ttl)?;
                let name = self.name(request.key);
                Ok(Claim {
                    id: name.server,
                    owner: request.owner,
                    key: request.key,
                })
            })
            .collect();
        let limit = self.settings.query_timeout;
        self.registry
            .confirm_many(claims, HOLDS_PER_STATEMENT, |session, servers| {
                let sql = Sql::holds_many(servers.iter().map(|server| server.as_str()));
                let (count, target) = (servers.len(), &self.settings.target);
                async move {
                    let context = || format!("verify {count} held locks on {target}");
                    let answer = bounded(BACKEND, "refresh", limit, async {
                        session
                            .run(Request::new(sql, limit))
                            .await
                            .map_err(|e| errors::backend("refresh", context(), e))
                    })
                    .await?;
                    let held = (0..count)
                        .map(|column| answer.int(column).map(|holds| holds == Some(1)))
                        .collect::<Result<Vec<bool>, String>>()
                        .map_err(|why| {
                            Error::backend(BACKEND, "refresh", format!("{}: {why}", context()))
                        })?;
                    answer.settle();
                    Ok(held)
                }
            })
            .await
    }

    /// Confirms `owner` still holds `name` on a live session: a round trip
    /// on the holding session, asking the server.
    pub(super) async fn verify(&self, name: LockName<'_>, owner: &str) -> Result<()> {
        let not_held = || Error::NotHeld {
            key: name.key.to_owned(),
        };
        let Some(session) = self.registry.session_of(&name.server, owner) else {
            return Err(not_held());
        };
        let limit = self.settings.query_timeout;
        let context = || format!("verify {:?} is held on {}", name.key, self.settings.target);
        let answer = bounded(BACKEND, "refresh", limit, async {
            session
                .run(Request::new(Sql::holds(&name), limit))
                .await
                .map_err(|e| errors::backend("refresh", context(), e))
        })
        .await?;
        let holds = answer
            .int(0)
            .map_err(|why| Error::backend(BACKEND, "refresh", format!("{}: {why}", context())))?;
        answer.settle();
        if holds == Some(1) {
            return Ok(());
        }
        if let Some(held) = self.registry.take(&name.server, owner) {
            held.lost.notify(LostReason::NotHeld);
        }
        Err(not_held())
    }
}
