//! Releasing and verifying held locks.

use super::errors::{self, BACKEND};
use super::fencing::Sql;
use super::names::{owner_digest, LockName};
use super::session::{Request, Session};
use super::Inner;
use crate::deadline::bounded;
use crate::session_registry::Claim;
use crate::{validate, Error, RefreshRequest, Result};

use std::sync::Arc;

/// The most locks one statement of [`Inner::refresh_many`] asks about (a
/// column each): a statement of about 30 KB, far under the default
/// `max_allowed_packet` (16 MB on MariaDB 10.11, 64 MB on MySQL 8).
const HOLDS_PER_STATEMENT: usize = 256;

impl Inner {
    /// Releases `name` if `owner` holds it through this locker; otherwise
    /// says whether somebody else holds it under that owner.
    pub(super) async fn release(&self, name: LockName<'_>, owner: &str) -> Result<()> {
        let Some(held) = self.core.take_for_release(&name.server, name.key, owner)? else {
            return self.release_elsewhere(name, owner).await;
        };
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
        let first = release(self.sql.release(&name));
        let bare = || release(Sql::release_only(&name));
        let answer = self.core.unlock_or_bare(name.key, first, bare).await?;
        let released = answer
            .int(0)
            .map_err(|why| Error::backend(BACKEND, "release", format!("{}: {why}", context())))?;
        answer.settle();
        // 0: another session holds it; NULL: nobody does. Either way this
        // session lost it (a `RELEASE_LOCK` or `RELEASE_ALL_LOCKS()` run on
        // it by hand?).
        self.core
            .finish_release(held, name.key, released == Some(1))
    }

    /// A release of a lock this locker does not hold. It cannot release it
    /// (only the session holding a `GET_LOCK` can), but it can say which
    /// error applies: `Unsupported` if another client holds it under
    /// `owner`, `NotHeld` if nobody does.
    async fn release_elsewhere(&self, name: LockName<'_>, owner: &str) -> Result<()> {
        let session = self.core.pool.shared(&name.server).await?;
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
        let holder = holder.map(|id| (format!("connection {id}"), format!("KILL {id}")));
        // Without fencing the holder's row, if any, says nothing of its owner.
        let same_owner = self.sql.fencing().then_some(same_owner == Some(1));
        Err(self
            .core
            .held_elsewhere(name.key, "a GET_LOCK lock", holder, same_owner))
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
        self.core
            .registry
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
        let limit = self.settings.query_timeout;
        let name = &name;
        let context = || format!("verify {:?} is held on {}", name.key, self.settings.target);
        let holds = |session: Arc<Session>| async move {
            let answer = bounded(BACKEND, "refresh", limit, async {
                session
                    .run(Request::new(Sql::holds(name), limit))
                    .await
                    .map_err(|e| errors::backend("refresh", context(), e))
            })
            .await?;
            let holds = answer.int(0).map_err(|why| {
                Error::backend(BACKEND, "refresh", format!("{}: {why}", context()))
            })?;
            answer.settle();
            Ok(holds == Some(1))
        };
        self.core.verify(&name.server, name.key, owner, holds).await
    }
}
