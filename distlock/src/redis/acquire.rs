//! The acquire engine: one attempt of the acquire script, retried once on
//! a connection found broken, undone by its owner token whenever its
//! outcome is unknown ([`PendingAcquire`]), and confirmed by replicas
//! (`WAIT`) when [`Config::min_replicas`](super::Config::min_replicas) asks.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::errors::{self, Outcome};
use super::scripts::{ACQUIRE_SCRIPT, ACQUIRE_SHARED_SCRIPT, READER_TOKEN_PREFIX};
use super::{inspect, ttl_millis, RedisLocker, BACKEND};
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
    /// One try: the acquire script (exclusive or shared), and once more
    /// with the same owner token if the connection was found broken. Not
    /// bounded by itself (see [`Locker::try_lock`]); every exit that leaves
    /// the outcome unknown, including being dropped, undoes the attempt by
    /// its token.
    pub(super) async fn acquire(
        &self,
        key: &str,
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
        let pending =
            PendingAcquire::arm(self, key, owner, ttl, "an acquire whose outcome is unknown");
        let owner = pending.owner();
        // Read on the caller's task, before anything is sent: its label scope.
        // Readers leave no record: the reader set holds their tokens only.
        let value = (self.inner.record_holder && mode == Mode::Exclusive).then(|| {
            let label = current_label();
            inspect::recorded_value(owner, ttl, std::process::id(), host_name(), &label)
        });
        let value = value.as_deref().unwrap_or(owner);
        let mut sent_at = Instant::now();
        let mut granted = self.run_grant_script(key, value, ttl, mode).await;
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
                granted = self.run_grant_script(key, value, ttl, mode).await;
            }
        }
        let fencing_token = match granted {
            // Held by another token: ours is not in the key, nothing to undo.
            Ok(None) => {
                pending.settle();
                return Ok(None);
            }
            Ok(Some(token)) => token,
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
            fencing_token: Some(fencing_token),
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
            .run_acquire_script(key, value.as_deref().unwrap_or(owner), ttl)
            .await
        {
            Ok(fence) => Ok(fence != 0),
            Err(err) => {
                let unknown = errors::outcome(&err) == Outcome::Unknown;
                Err(self.inner.target.error("acquire", err, unknown))
            }
        }
    }

    /// The acquire script of `mode`: the fencing token of the grant, or
    /// `None` for contention. Exclusive, it writes `value` into the lock;
    /// shared, `value` is the reader's owner token.
    async fn run_grant_script(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
        mode: Mode,
    ) -> redis::RedisResult<Option<u64>> {
        match mode {
            // 0: held by another token.
            Mode::Exclusive => {
                Ok(Some(self.run_acquire_script(key, value, ttl).await?)
                    .filter(|&fence| fence != 0))
            }
            Mode::Shared => {
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
                Ok(u64::try_from(fence).ok())
            }
        }
    }

    /// The acquire script, writing `value` into the lock: the bare owner
    /// token, or the token and its holder record (see
    /// [`inspect::recorded_value`]).
    async fn run_acquire_script(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> redis::RedisResult<u64> {
        ACQUIRE_SCRIPT
            .key(self.inner.keys.lock_key(key))
            .key(self.inner.keys.fence_key(key))
            .arg(value)
            .arg(ttl_millis(ttl))
            .invoke_async(&mut self.connection())
            .await
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
