//! Releasing and verifying held locks.

use super::errors;
use super::keys::{owner_digest, LockKey};
use super::Inner;
use crate::session_registry::Claim;
use crate::{RefreshRequest, Result};

use std::collections::HashSet;

/// What kind of lock a release elsewhere found.
const LOCK: &str = "a session advisory lock";

impl Inner {
    /// Releases `key` if `owner` holds it through this locker; otherwise
    /// says whether somebody else holds it under that owner.
    pub(super) async fn release(&self, key: LockKey<'_>, owner: &str) -> Result<()> {
        let Some(held) = self.core.take_for_release(&key.id, key.name, owner)? else {
            return self.release_elsewhere(key, owner).await;
        };
        let query_timeout = self.settings.query_timeout;
        let context = || {
            format!(
                "release {:?} on {}; the server frees it when the session ends",
                key.name, self.settings.target
            )
        };
        let session = &held.session;
        let unlock = errors::within("release", query_timeout, context, session.unlock(key.id));
        let bare = || {
            let unlock = session.unlock_if_held(key.id);
            errors::within("release", query_timeout, context, unlock)
        };
        let unlocked = self.core.unlock_or_bare(key.name, unlock, bare).await?;
        // Only the session itself can release its lock; if it did not,
        // something ran `pg_advisory_unlock_all()` on it.
        self.core.finish_release(held, key.name, unlocked)
    }

    /// A release of a lock this locker does not hold. It cannot release it
    /// (a session lock is only released by its session), but it can say
    /// which error applies: `Unsupported` if another client holds it under
    /// `owner`, `NotHeld` if nobody holds it under `owner`.
    async fn release_elsewhere(&self, key: LockKey<'_>, owner: &str) -> Result<()> {
        let session = self.core.pool.shared(&key.id).await?;
        let digest = owner_digest(owner);
        let query_timeout = self.settings.query_timeout;
        let lookup = async {
            if self.fencing() {
                session.query(&self.sql.holder, &[&key.id, &digest]).await
            } else {
                session.query(&self.sql.holder, &[&key.id]).await
            }
        };
        let context = || {
            format!(
                "look up the holder of {:?} on {}",
                key.name, self.settings.target
            )
        };
        let rows = errors::within("release", query_timeout, context, lookup).await?;
        let Some(row) = rows.first() else {
            return Err(self.core.held_elsewhere(key.name, LOCK, None, None));
        };
        let columns =
            || Ok::<_, tokio_postgres::Error>((row.try_get::<_, i32>(0)?, row.try_get(1)?));
        let (pid, same_owner): (i32, Option<bool>) =
            columns().map_err(|e| errors::backend("release", context(), e))?;
        let who = format!("server process {pid}");
        let holder = Some((who, format!("pg_terminate_backend({pid})")));
        Err(self.core.held_elsewhere(key.name, LOCK, holder, same_owner))
    }

    /// [`Locker::refresh_many`](crate::Locker::refresh_many) of either key
    /// kind: `key_of` maps a request to its lock (or the error that request
    /// gets); the valid ones are confirmed with one statement per session
    /// that holds some of them (sent at once), each naming the keys it no
    /// longer holds (see [`Registry::confirm_many`](crate::session_registry::Registry::confirm_many)).
    pub(super) async fn refresh_many<'a>(
        &self,
        requests: &[RefreshRequest<'a>],
        key_of: impl Fn(&RefreshRequest<'a>) -> Result<LockKey<'a>>,
    ) -> Vec<Result<()>> {
        let claims = requests
            .iter()
            .map(|request| {
                key_of(request).map(|key| Claim {
                    id: key.id,
                    owner: request.owner,
                    key: key.name,
                })
            })
            .collect();
        let query_timeout = self.settings.query_timeout;
        self.core
            .registry
            .confirm_many(claims, usize::MAX, |session, ids| {
                let ids: Vec<i64> = ids.iter().map(|&&id| id).collect();
                let target = &self.settings.target;
                async move {
                    let context = || format!("verify {} held locks on {target}", ids.len());
                    let lost: HashSet<i64> =
                        errors::within("refresh", query_timeout, context, session.lost_among(&ids))
                            .await?
                            .into_iter()
                            .collect();
                    Ok(ids.iter().map(|id| !lost.contains(id)).collect())
                }
            })
            .await
    }

    /// Confirms `owner` still holds `key` on a live session: a round trip on
    /// the holding session, asking the server.
    pub(super) async fn verify(&self, key: LockKey<'_>, owner: &str) -> Result<()> {
        let query_timeout = self.settings.query_timeout;
        let context = || format!("verify {:?} is held on {}", key.name, self.settings.target);
        self.core
            .verify(&key.id, key.name, owner, |session| async move {
                errors::within("refresh", query_timeout, context, session.holds(key.id)).await
            })
            .await
    }
}
