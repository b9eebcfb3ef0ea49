//! Releasing and verifying held locks.

use super::errors::{self, BACKEND};
use super::keys::{owner_digest, LockKey};
use super::registry::Busy;
use super::session::Role;
use super::Inner;
use crate::{Error, LostReason, RefreshRequest, Result};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::session::Session;

impl Inner {
    /// Releases `key` if `owner` holds it through this locker; otherwise
    /// says whether somebody else holds it under that owner.
    pub(super) async fn release(&self, key: LockKey<'_>, owner: &str) -> Result<()> {
        let Some(held) = self.registry.take(&key.id, owner) else {
            return self.release_elsewhere(key, owner).await;
        };
        // The entry is gone before the unlock is sent, with no await in
        // between: the unlock is queued on the session first, so an attempt
        // on this key that now reserves it and reaches the same session is
        // ordered after it by the server.
        let query_timeout = self.settings.query_timeout;
        let context = || {
            format!(
                "release {:?} on {}; the server frees it when the session ends",
                key.name, self.settings.target
            )
        };
        let unlock = held.session.unlock(key.id);
        if errors::within("release", query_timeout, context, unlock).await? {
            if held.session.role == Role::Waiter {
                self.pool.recycle(held.session);
            }
            return Ok(());
        }
        // Only the session itself can release its lock, and it did not:
        // something ran `pg_advisory_unlock_all()` on it?
        held.lost.notify(LostReason::NotHeld);
        Err(Error::NotHeld {
            key: key.name.to_owned(),
        })
    }

    /// A release of a lock this locker does not hold. It cannot release it
    /// (a session lock is only released by its session), but it can say
    /// which error applies: `Unsupported` if another client holds it under
    /// `owner`, `NotHeld` if nobody holds it under `owner`.
    async fn release_elsewhere(&self, key: LockKey<'_>, owner: &str) -> Result<()> {
        let not_held = || Error::NotHeld {
            key: key.name.to_owned(),
        };
        match self.registry.state(&key.id) {
            // Held (or being taken) here, under another owner.
            Some(Busy::Contended) => return Err(not_held()),
            // Held for nobody here, perhaps; or free, or held elsewhere: the
            // server cannot be asked until the cleanup is done.
            Some(Busy::CleaningUp) => return Err(self.cleanup_pending(key, "release")),
            None => {}
        }
        let session = self.pool.shared(key.id).await?;
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
            return Err(not_held());
        };
        let columns =
            || Ok::<_, tokio_postgres::Error>((row.try_get::<_, i32>(0)?, row.try_get(1)?));
        let (pid, same_owner): (i32, Option<bool>) =
            columns().map_err(|e| errors::backend("release", context(), e))?;
        let reason = match same_owner {
            Some(false) => return Err(not_held()),
            Some(true) => format!(
                "{:?} is held under this owner token by another client (server process {pid}); a session \
                 advisory lock can only be released by the session holding it: release it from that client, \
                 or end its session (pg_terminate_backend({pid})) to free it",
                key.name
            ),
            None => format!(
                "{:?} is held by server process {pid}; without the fencing table this client cannot tell \
                 whether under this owner token, and only the session holding it can release it",
                key.name
            ),
        };
        Err(Error::Unsupported {
            backend: BACKEND,
            operation: "release",
            reason,
        })
    }

    /// [`Locker::refresh_many`](crate::Locker::refresh_many) of either key
    /// kind: `key_of` maps a request to its lock (or the error that request
    /// gets), the valid ones are verified in one batch.
    pub(super) async fn refresh_many<'a>(
        &self,
        requests: &[RefreshRequest<'a>],
        key_of: impl Fn(&RefreshRequest<'a>) -> Result<LockKey<'a>>,
    ) -> Vec<Result<()>> {
        let parsed: Vec<Result<LockKey<'a>>> = requests.iter().map(key_of).collect();
        let valid: Vec<(LockKey<'a>, &str)> = parsed
            .iter()
            .zip(requests)
            .filter_map(|(key, request)| key.as_ref().ok().map(|key| (*key, request.owner)))
            .collect();
        let mut verified = self.verify_many(&valid).await.into_iter();
        parsed
            .into_iter()
            .map(|key| match key {
                Ok(_) => verified.next().unwrap_or_else(|| {
                    Err(Error::backend(BACKEND, "refresh", "no answer for a key"))
                }),
                Err(error) => Err(error),
            })
            .collect()
    }

    /// [`verify`](Inner::verify) for many keys: one statement per session
    /// that holds some of them (sent at once), each confirming which of its
    /// keys it still holds. A key not held (here or on its session) is
    /// [`Error::NotHeld`] and its lease is told; a failed statement fails
    /// the keys it carried.
    pub(super) async fn verify_many(&self, keys: &[(LockKey<'_>, &str)]) -> Vec<Result<()>> {
        let not_held = |key: &LockKey<'_>| Error::NotHeld {
            key: key.name.to_owned(),
        };
        let mut results: Vec<Option<Result<()>>> = Vec::with_capacity(keys.len());
        let mut sessions: HashMap<u64, (Arc<Session>, Vec<usize>)> = HashMap::new();
        for (index, (key, owner)) in keys.iter().enumerate() {
            match self.registry.session_of(&key.id, owner) {
                Some(session) => {
                    sessions
                        .entry(session.id)
                        .or_insert_with(|| (session, Vec::new()))
                        .1
                        .push(index);
                    results.push(None);
                }
                None => results.push(Some(Err(not_held(key)))),
            }
        }
        let query_timeout = self.settings.query_timeout;
        let answers =
            futures_util::future::join_all(sessions.values().map(|(session, indexes)| {
                let ids: Vec<i64> = indexes.iter().map(|&index| keys[index].0.id).collect();
                let context = move || {
                    format!(
                        "verify {} held locks on {}",
                        indexes.len(),
                        self.settings.target
                    )
                };
                async move {
                    errors::within("refresh", query_timeout, context, session.lost_among(&ids))
                        .await
                }
            }))
            .await;
        for ((_, indexes), answer) in sessions.values().zip(answers) {
            match answer {
                Ok(lost) => {
                    let lost: HashSet<i64> = lost.into_iter().collect();
                    for &index in indexes {
                        let (key, owner) = &keys[index];
                        results[index] = Some(if !lost.contains(&key.id) {
                            Ok(())
                        } else {
                            if let Some(gone) = self.registry.take(&key.id, owner) {
                                gone.lost.notify(LostReason::NotHeld);
                            }
                            Err(not_held(key))
                        });
                    }
                }
                Err(error) => {
                    for &index in indexes {
                        results[index] = Some(Err(error.duplicate()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(Error::backend(BACKEND, "refresh", "no answer for a key"))
                })
            })
            .collect()
    }

    /// Confirms `owner` still holds `key` on a live session: a round trip on
    /// the holding session, asking the server.
    pub(super) async fn verify(&self, key: LockKey<'_>, owner: &str) -> Result<()> {
        let not_held = || Error::NotHeld {
            key: key.name.to_owned(),
        };
        let Some(session) = self.registry.session_of(&key.id, owner) else {
            return Err(not_held());
        };
        let query_timeout = self.settings.query_timeout;
        let context = || format!("verify {:?} is held on {}", key.name, self.settings.target);
        if errors::within("refresh", query_timeout, context, session.holds(key.id)).await? {
            return Ok(());
        }
        if let Some(held) = self.registry.take(&key.id, owner) {
            held.lost.notify(LostReason::NotHeld);
        }
        Err(not_held())
    }
}
