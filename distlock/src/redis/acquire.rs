//! The acquire engine: one attempt of the acquire script, retried once on
//! a connection found broken, undone by its owner token whenever its
//! outcome is unknown ([`PendingAcquire`]), and confirmed by replicas
//! (`WAIT`) when [`Config::min_replicas`](super::Config::min_replicas) asks.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::errors::{self, Outcome};
use super::scripts::{
    ACQUIRE_SCRIPT, ACQUIRE_SHARED_SCRIPT, ACQUIRE_UNFENCED_SCRIPT, READER_TOKEN_PREFIX,
};
use super::{inspect, ttl_millis, RedisLocker, BACKEND};
use crate::deadline::bounded;
use crate::inspect::{current_label, host_name};
use crate::pending::PendingAcquire;
use crate::{new_owner_token, Error, Lease, LeaseParts, Locker, Result};

/// [`Config::min_replicas`] and [`Config::replica_timeout`], when set.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReplicaAck {
    pub(super) min_replicas: u32,
    pub(super) timeout: Duration,
}

/// What an acquire asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// The lock key, alone ([`Locker::try_lock`]).
    Exclusive,
    /// A place in the reader set ([`Locker::try_lock_shared`]).
    Shared,
}

impl RedisLocker {
    /// One [`acquire`](Self::acquire) under the acquire bound (the
    /// operation bound, plus the `WAIT` and a release when replicas must
    /// acknowledge), abandoned past it with [`Error::DeadlineExceeded`] for
    /// `operation`: what `try_lock`, `try_lock_shared` and `try_lock_any`
    /// run once their input is valid.
    pub(super) async fn try_acquire(
        &self,
        operation: &'static str,
        keys: &[&str],
        ttl: Duration,
        mode: Mode,
    ) -> Result<Option<Lease>> {
        let attempt = self.acquire(keys, ttl, mode);
        bounded(BACKEND, operation, self.inner.acquire_bound, attempt).await
    }

    /// One try: the acquire script (exclusive or shared), and once more
    /// with the same owner token if the connection was found broken. Not
    /// bounded by itself (see [`Locker::try_lock`]); every exit that leaves
    /// the outcome unknown, including being dropped, undoes the attempt by
    /// its token.
    ///
    /// Exclusive, `keys` are tried in order in the one script and the first
    /// free one is granted ([`Locker::try_lock_any`]; one key for
    /// [`Locker::try_lock`]); shared, `keys` is the one key.
    pub(super) async fn acquire(
        &self,
        keys: &[&str],
        ttl: Duration,
        mode: Mode,
    ) -> Result<Option<Lease>> {
        let owner = match mode {
            Mode::Exclusive => new_owner_token(),
            // The prefix sends its unlock and refresh to the reader scripts
            // (see `scripts.rs`, "Shared locks").
            Mode::Shared => format!("{READER_TOKEN_PREFIX}{}", new_owner_token()),
        };
        // Armed from here on: the request may be on the wire at any await below.
        let pending = PendingAcquire::arm(
            self,
            keys,
            owner,
            ttl,
            "an acquire whose outcome is unknown",
        );
        let owner = pending.owner();
        // Read on the caller's task, before anything is sent: its label scope.
        // Readers leave no record: the reader set holds their tokens only.
        let value = (self.inner.record_holder && mode == Mode::Exclusive).then(|| {
            let label = current_label();
            inspect::recorded_value(owner, ttl, std::process::id(), host_name(), &label)
        });
        let value = value.as_deref().unwrap_or(owner);
        let mut sent_at = Instant::now();
        let mut granted = self.run_grant_script(keys, value, ttl, mode, false).await;
        let mut retried = false;
        if let Err(err) = &granted {
            // The connection was found broken (a restart, a failover or a
            // reset closed it) and is being replaced: one more attempt, on the
            // new connection, with the same token. If the first one took
            // effect, the script recognises its own token and returns that
            // grant (see `scripts::ACQUIRE`). Refusals are not retried: the
            // server is down, and a retry would only double the wait.
            if err.is_connection_dropped() && !err.is_connection_refusal() {
                retried = true;
                sent_at = Instant::now();
                granted = self.run_grant_script(keys, value, ttl, mode, true).await;
            }
        }
        let (key, fencing_token) = match granted {
            // Held by other tokens: ours is in no key, nothing to undo.
            Ok(None) => {
                pending.settle();
                return Ok(None);
            }
            Ok(Some((index, token))) => match keys.get(index) {
                Some(&key) => (key, token),
                // Still armed: the grant, wherever it is, is undone.
                None => {
                    return Err(Error::backend(
                        BACKEND,
                        "acquire",
                        format!(
                            "{}: the acquire script granted key {} of the {} it was sent",
                            self.inner.target.endpoint,
                            index + 1,
                            keys.len()
                        ),
                    ))
                }
            },
            Err(err) => {
                let outcome_unknown = retried || errors::outcome(&err) == Outcome::Unknown;
                if !outcome_unknown {
                    pending.settle();
                }
                // Dropping `pending` still armed releases the lock by its
                // token in the background, in case the acquire took effect.
                return Err(self.inner.target.error("acquire", err, outcome_unknown));
            }
        };
        if let Some(ack) = self.inner.replicas {
            // Still armed: a failed or short WAIT leaves a grant to undo,
            // unless it was released already.
            if let Err((error, released)) = self.confirm_replicas(key, ack, pending.owner()).await {
                if released {
                    pending.settle();
                }
                return Err(error);
            }
        }
        let parts = LeaseParts {
            key: key.to_owned(),
            owner: pending.settle(),
            // With fencing off the script answered 1, no token.
            fencing_token: self.inner.fencing.then_some(fencing_token),
            ttl,
            valid_until: Some(sent_at + ttl),
        };
        Ok(Some(Lease::new(
            parts,
            self.inner.leases.get_or_init(|| Arc::new(self.clone())),
        )))
    }

    /// One run of the acquire script for `owner`, a token the caller chose,
    /// without the retry and the undo guard of [`Locker::try_lock`]: the
    /// Redlock backend runs it on each of its nodes and undoes by token
    /// itself. `Ok(true)`: the key holds `owner` now (a new grant, or it
    /// already did and its ttl was re-armed); `Ok(false)`: another token
    /// holds it. An error says whether the script may have run
    /// ([`Error::is_outcome_unknown`]). Bounded by the caller. `holder` is
    /// recorded with a new grant when given (and this locker records
    /// holders).
    #[cfg(feature = "redlock")]
    pub(crate) async fn acquire_as(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        holder: Option<&crate::inspect::Holder>,
    ) -> Result<bool> {
        let value = holder
            .filter(|_| self.inner.record_holder)
            .map(|h| inspect::recorded_value(owner, ttl, h.pid, &h.host, &h.label));
        match self
            .run_acquire_script(&[key], value.as_deref().unwrap_or(owner), ttl, false)
            .await
        {
            Ok(granted) => Ok(granted.is_some()),
            Err(err) => {
                let unknown = errors::outcome(&err) == Outcome::Unknown;
                Err(self.inner.target.error("acquire", err, unknown))
            }
        }
    }

    /// The acquire script of `mode`: the index in `keys` of the key granted
    /// and the grant's fencing token, or `None` for contention. Exclusive,
    /// it writes `value` into the lock; shared, `value` is the reader's
    /// owner token and `keys` is one key. `retry`: the same attempt sent
    /// again (see `scripts::ACQUIRE`).
    async fn run_grant_script(
        &self,
        keys: &[&str],
        value: &str,
        ttl: Duration,
        mode: Mode,
        retry: bool,
    ) -> redis::RedisResult<Option<(usize, u64)>> {
        match mode {
            Mode::Exclusive => self.run_acquire_script(keys, value, ttl, retry).await,
            Mode::Shared => {
                let key = keys.first().copied().unwrap_or_default();
                let keys = &self.inner.keys;
                let fence: i64 = ACQUIRE_SHARED_SCRIPT
                    .key(keys.lock_key(key))
                    .key(keys.readers_key(key))
                    .key(keys.fence_key(key))
                    .arg(value)
                    .arg(ttl_millis(ttl))
                    .invoke_async(&mut self.connection())
                    .await?;
                // -1: a writer holds the key.
                Ok(u64::try_from(fence).ok().map(|fence| (0, fence)))
            }
        }
    }

    /// The acquire script over `keys` in order, writing `value` into the
    /// key it grants: the bare owner token, or the token and its holder
    /// record (see [`inspect::recorded_value`]). The index in `keys` of the
    /// key granted and its fencing token, or `None` if every key is held
    /// by another token. `retry`: the same attempt sent again.
    async fn run_acquire_script(
        &self,
        keys: &[&str],
        value: &str,
        ttl: Duration,
        retry: bool,
    ) -> redis::RedisResult<Option<(usize, u64)>> {
        let mut invocation = if self.inner.fencing {
            ACQUIRE_SCRIPT.prepare_invoke()
        } else {
            ACQUIRE_UNFENCED_SCRIPT.prepare_invoke()
        };
        for key in keys {
            invocation.key(self.inner.keys.lock_key(key));
            if self.inner.fencing {
                invocation.key(self.inner.keys.fence_key(key));
            }
        }
        invocation.arg(value).arg(ttl_millis(ttl));
        if retry {
            invocation.arg("retry");
        }
        let reply: redis::Value = invocation.invoke_async(&mut self.connection()).await?;
        granted_key(reply)
    }

    /// Waits (`WAIT`, on the node that took the grant) until
    /// `ack.min_replicas` replicas have every write this connection made,
    /// the grant included. On a shortfall it releases the grant by `owner`
    /// at once and fails (`true`: released); if that release fails, or the
    /// `WAIT` itself does (`false`), the caller's armed [`PendingAcquire`]
    /// releases it in the background.
    ///
    /// The connection is multiplexed, so the `WAIT` also covers other tasks'
    /// writes sent before it: it can only wait longer than needed, never
    /// vouch for less.
    async fn confirm_replicas(
        &self,
        key: &str,
        ack: ReplicaAck,
        owner: &str,
    ) -> std::result::Result<(), (Error, bool)> {
        let acknowledged = self
            .wait_for_replicas(&self.inner.keys.lock_key(key), ack)
            .await
            .map_err(|e| (self.inner.target.error("acquire", e, true), false))?;
        if acknowledged >= ack.min_replicas {
            return Ok(());
        }
        let (released, undo) = match Locker::unlock(self, key, owner).await {
            Ok(()) | Err(Error::NotHeld { .. }) => (true, "it was released"),
            Err(_) => (
                false,
                "releasing it failed, so it is being released by its owner token in the \
                 background (failing that, it expires at its ttl)",
            ),
        };
        let error = Error::backend(
            BACKEND,
            "acquire",
            format!(
                "{}: only {acknowledged} replica(s) acknowledged the grant of {key:?} within \
                 {:?}, {} required (min_replicas); {undo}",
                self.inner.target.endpoint, ack.timeout, ack.min_replicas
            ),
        );
        Err((error, released))
    }

    /// `WAIT min_replicas timeout` on the node serving `redis_key` (on a
    /// cluster, the master of its slot): how many replicas have every write
    /// this connection made before it.
    pub(super) async fn wait_for_replicas(
        &self,
        redis_key: &str,
        ack: ReplicaAck,
    ) -> redis::RedisResult<u32> {
        let timeout_millis = u64::try_from(ack.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut wait = redis::cmd("WAIT");
        wait.arg(ack.min_replicas).arg(timeout_millis);
        self.connection().query_on_node_of(redis_key, wait).await
    }
}

/// The acquire script's reply (see `scripts::ACQUIRE`) as the index of the
/// key granted and its fencing token: `0` none (contention), `fence` the
/// first key, `{i, fence}` the `i`-th (from 1).
fn granted_key(reply: redis::Value) -> redis::RedisResult<Option<(usize, u64)>> {
    if let redis::Value::Int(fence) = reply {
        return Ok(u64::try_from(fence)
            .ok()
            .filter(|&fence| fence != 0)
            .map(|fence| (0, fence)));
    }
    let (position, fence): (usize, u64) = redis::from_redis_value(reply)?;
    Ok(position.checked_sub(1).map(|index| (index, fence)))
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::granted_key;

    #[test]
    fn the_acquire_reply_names_the_key_granted() {
        assert_eq!(granted_key(Value::Int(0)).unwrap(), None, "contention");
        assert_eq!(
            granted_key(Value::Int(7)).unwrap(),
            Some((0, 7)),
            "the first key"
        );
        let third = Value::Array(vec![Value::Int(3), Value::Int(12)]);
        assert_eq!(granted_key(third).unwrap(), Some((2, 12)));
        assert!(
            granted_key(Value::Nil).is_err(),
            "not a reply of the script"
        );
    }
}
