//! [`Locker::refresh_many`](crate::Locker::refresh_many) on Redis: one script per batch, or one per slot
//! on a cluster (a script may only touch keys of one slot), sent at once.
//! Writers' and readers' leases go in the same batch: a reader's lock key
//! is followed by its reader set (see `scripts.rs`, `REFRESH_MANY`).

use std::time::Duration;

use super::connection::Connection;
use super::scripts::REFRESH_MANY_SCRIPT;
use super::{is_reader_token, ttl_millis, RedisLocker, BACKEND};
use crate::{validate, Error, RefreshRequest, Result};

/// Why one script of a [`Locker::refresh_many`](crate::Locker::refresh_many) batch failed: every key it
/// carried gets this error.
enum GroupFailure {
    Redis(redis::RedisError),
    Deadline(Duration),
}

impl GroupFailure {
    fn to_error(&self, locker: &RedisLocker) -> Error {
        match self {
            GroupFailure::Redis(error) => {
                locker.inner.target.error("refresh", error.clone(), false)
            }
            GroupFailure::Deadline(after) => Error::DeadlineExceeded {
                backend: BACKEND,
                operation: "refresh",
                after: *after,
            },
        }
    }
}

impl RedisLocker {
    /// [`Locker::refresh_many`](crate::Locker::refresh_many): the requests grouped by the script call
    /// that carries them (one, or one per slot on a cluster), the groups sent
    /// at once.
    pub(super) async fn refresh_batch(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = requests
            .iter()
            .map(|request| validate::acquire(request.key, request.ttl).err().map(Err))
            .collect();
        // The valid requests by the script call that carries them.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let cluster = matches!(self.inner.connection, Connection::Cluster(_));
        let mut by_slot = std::collections::HashMap::new();
        for (index, _) in results.iter().enumerate().filter(|(_, r)| r.is_none()) {
            let group = if cluster {
                let slot = redis::cluster_routing::Slot::for_key(
                    self.inner.keys.lock_key(requests[index].key),
                );
                *by_slot.entry(slot).or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                })
            } else {
                if groups.is_empty() {
                    groups.push(Vec::new());
                }
                0
            };
            groups[group].push(index);
        }
        let answers = futures_util::future::join_all(
            groups
                .iter()
                .map(|group| self.refresh_group(requests, group)),
        )
        .await;
        for (group, answer) in groups.iter().zip(answers) {
            match answer {
                Ok(refreshed) => {
                    for (&index, refreshed) in group.iter().zip(refreshed) {
                        results[index] = Some(match refreshed {
                            1 => Ok(()),
                            _ => Err(Error::not_held(requests[index].key)),
                        });
                    }
                }
                Err(failure) => {
                    for &index in group {
                        results[index] = Some(Err(failure.to_error(self)));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(Error::backend(
                        BACKEND,
                        "refresh",
                        "the refresh script answered fewer keys than it was sent",
                    ))
                })
            })
            .collect()
    }

    /// One [`REFRESH_MANY_SCRIPT`] call for the requests at `indexes` (all in
    /// one slot on a cluster), under the operation bound: one 0/1 per key.
    async fn refresh_group(
        &self,
        requests: &[RefreshRequest<'_>],
        indexes: &[usize],
    ) -> std::result::Result<Vec<i64>, GroupFailure> {
        let mut invocation = REFRESH_MANY_SCRIPT.prepare_invoke();
        for &index in indexes {
            let request = &requests[index];
            invocation
                .key(self.inner.keys.lock_key(request.key))
                .arg(request.owner)
                .arg(ttl_millis(request.ttl));
            // The script gives a reader's token (by the same rule) its
            // reader set, the key after its lock key.
            if is_reader_token(request.owner) {
                invocation.key(self.inner.keys.readers_key(request.key));
            }
        }
        let mut connection = self.connection();
        let call = invocation.invoke_async(&mut connection);
        match tokio::time::timeout(self.inner.operation_bound, call).await {
            Ok(Ok(refreshed)) => Ok(refreshed),
            Ok(Err(error)) => Err(GroupFailure::Redis(error)),
            Err(_) => Err(GroupFailure::Deadline(self.inner.operation_bound)),
        }
    }
}
