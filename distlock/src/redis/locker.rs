//! The [`Locker`] impl of [`RedisLocker`]: each method one script, or a
//! step written in its own file (the acquire engine in `acquire.rs`, the
//! refresh batch in `refresh.rs`, marks in `marks.rs`, inspection in
//! `inspect.rs`, release notifications in `releases.rs`), every call bounded
//! as the [module docs](super) say.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, ScriptInvocation};

use super::acquire::Mode;
use super::connection::Connection;
use super::scripts::{
    FORGET_SCRIPT, REFRESH_SCRIPT, REFRESH_SHARED_SCRIPT, RELEASE_SCRIPT, RELEASE_SHARED_SCRIPT,
};
use super::{is_reader_token, ttl_millis, RedisLocker, BACKEND};
use crate::inspect::{ForceRelease, HeldLock};
use crate::{
    validate, Capabilities, Error, Lease, Locker, MarkAdvance, RefreshRequest, ReleaseWatch, Result,
};

impl RedisLocker {
    /// The script that handles `owner` on `key`, its keys set: for a
    /// reader's token (see `scripts.rs`, "Shared locks") `shared` on the
    /// lock key and the reader set, for any other `exclusive` on the lock
    /// key. Release and refresh tell a reader from a writer by this one
    /// rule, so a token reaches the same kind of script in both.
    fn owner_script(
        &self,
        key: &str,
        owner: &str,
        exclusive: &'static Script,
        shared: &'static Script,
    ) -> ScriptInvocation<'static> {
        let keys = &self.inner.keys;
        if is_reader_token(owner) {
            let mut invocation = shared.key(keys.lock_key(key));
            invocation.key(keys.readers_key(key));
            invocation
        } else {
            exclusive.key(keys.lock_key(key))
        }
    }
}

#[async_trait]
impl Locker for RedisLocker {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // A waiting writer polls (woken by releases) beside new readers:
            // nothing queues it ahead of them.
            writer_priority: false,
            fencing: self.inner.fencing,
            ..Capabilities::ALL
        }
    }

    fn backend_key(&self, key: &str) -> String {
        RedisLocker::backend_key(self, key)
    }

    /// One attempt at a shared (reader) lease: one script adds the reader
    /// to `<prefix>{<key>}:readers` unless a writer holds the key (see the
    /// [module docs](super), "Shared locks"). Bounded, retried and undone
    /// like [`try_lock`](Locker::try_lock). The lease's owner token starts
    /// with `shared:`; its fencing token is the key's last writer's.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Locker::try_lock): `Ok(None)` while a writer holds
    /// the key; [`Error::Backend`] or [`Error::DeadlineExceeded`] on an
    /// outage; [`Error::InvalidInput`] for a bad key or ttl.
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Locker::try_lock): a dropped attempt is undone by
    /// its owner token in the background (failing that, the reader expires
    /// at its ttl).
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        self.try_acquire("acquire_shared", &[key], ttl, Mode::Shared)
            .await
    }

    /// One attempt, bounded by [`RedisLocker::operation_bound`] (retry
    /// included; see the [module docs](super), "Connections").
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future after the request may have been sent
    /// releases the lock by its owner token in the background (failing that,
    /// it expires at its ttl), as does an attempt abandoned at its bound
    /// ([`Error::DeadlineExceeded`]) or whose reply was lost.
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        validate::acquire(key, ttl)?;
        self.try_acquire("acquire", &[key], ttl, Mode::Exclusive)
            .await
    }

    /// One script for the whole attempt, at any occupancy: it tries the
    /// keys in order and grants the first free one exactly as
    /// [`try_lock`](Locker::try_lock) grants its key (the same script:
    /// owner token and holder record, fencing counter, ttl), so a key taken
    /// here is an ordinary lock. Bounded, retried once on a broken
    /// connection, and confirmed by replicas like `try_lock`. See the
    /// [module docs](super), "Semaphores".
    ///
    /// **On a Redis Cluster** the keys are tried one at a time
    /// ([`try_lock_in_turn`](crate::try_lock_in_turn), one script per key):
    /// a script may only touch keys of one slot, and each key is its own
    /// hash tag, so a semaphore's permit keys are spread over the slots.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Locker::try_lock); [`Error::InvalidInput`] also for
    /// no keys or more than
    /// [`MAX_KEYS_PER_ATTEMPT`](crate::validate::MAX_KEYS_PER_ATTEMPT).
    ///
    /// # Cancel safety
    ///
    /// As [`try_lock`](Locker::try_lock): an attempt dropped (or abandoned
    /// at its bound, or whose reply was lost) after it was sent is undone
    /// in the background by its owner token, on whichever of the keys holds
    /// it (at most one does); failing that, that key expires at its ttl.
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        if matches!(self.inner.connection, Connection::Cluster(_)) {
            return crate::try_lock_in_turn(self, keys, ttl).await;
        }
        validate::keys(keys)?;
        validate::ttl(ttl)?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.try_acquire("acquire", &keys, ttl, Mode::Exclusive)
            .await
    }

    /// One script: compare-and-delete for a writer's token; for a reader's
    /// (it starts with `shared:`), removal from the reader set, the last
    /// reader deleting the marker and publishing the release (see the
    /// [module docs](super), "Shared locks"). Bounded like every call.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `owner` holds no live grant of `key` (nothing
    /// changed; an expired reader's leftover entry is cleared);
    /// [`Error::Backend`] or [`Error::DeadlineExceeded`] on an outage (the
    /// grant then expires at its ttl).
    ///
    /// # Cancel safety
    ///
    /// The script is atomic: a dropped unlock released the grant or left
    /// it as it was. Releasing again by the token is safe.
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        validate::key(key)?;
        let mut release = self.owner_script(key, owner, &RELEASE_SCRIPT, &RELEASE_SHARED_SCRIPT);
        release
            .arg(owner)
            .arg(self.inner.keys.release_channel(key))
            .arg(self.inner.publish);
        Error::unless_held(key, self.script_did("release", &release).await?)
    }

    /// One script: compare-and-`PEXPIRE` for a writer's token; for a
    /// reader's (it starts with `shared:`), a new score in the reader set,
    /// the marker re-armed to the last reader's expiry (see the [module
    /// docs](super), "Shared locks"). Bounded like every call.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `owner` holds no live grant of `key` (nothing
    /// changed: an expired reader is not revived); [`Error::Backend`] or
    /// [`Error::DeadlineExceeded`] on an outage.
    ///
    /// # Cancel safety
    ///
    /// The script is atomic: a dropped refresh extended the grant or left
    /// it as it was.
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        validate::acquire(key, ttl)?;
        let mut refresh = self.owner_script(key, owner, &REFRESH_SCRIPT, &REFRESH_SHARED_SCRIPT);
        refresh.arg(owner).arg(ttl_millis(ttl));
        Error::unless_held(key, self.script_did("refresh", &refresh).await?)
    }

    /// One script per batch on one server (or sentinel-managed master), one
    /// per slot on a cluster (a script may only touch keys of one slot), the
    /// slots' scripts sent at once. Each key answers as
    /// [`refresh`](Locker::refresh) would; a failed script fails the keys it
    /// carried.
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        self.refresh_batch(requests).await
    }

    /// Deletes `key`'s fencing counter (`{key}:fence`) if the lock is free,
    /// in one script; [`Error::NotAcquired`] if it is held. Bounded like
    /// every call; the script is atomic, so a dropped call either forgot
    /// the key or left it as it was.
    async fn forget(&self, key: &str) -> Result<()> {
        validate::key(key)?;
        let mut forget = FORGET_SCRIPT.key(self.inner.keys.lock_key(key));
        forget.key(self.inner.keys.fence_key(key));
        if self.script_did("forget", &forget).await? {
            Ok(())
        } else {
            Err(Error::not_acquired(key))
        }
    }

    /// One script on `<prefix>{<name>}:mark`, a key without expiry (see
    /// `scripts.rs` for its encoding). A reply lost on a broken connection
    /// leaves the outcome unknown ([`Error::is_outcome_unknown`]). With
    /// [`Config::min_replicas`](super::Config::min_replicas), a mark that was advanced is followed by
    /// `WAIT` (bounded like every call); too few acknowledgements fail it as
    /// an outage whose outcome is unknown. The first call logs the
    /// [durability warnings](Locker::durability_warnings), unless they were
    /// asked for already.
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        self.raise_mark(name, value).await
    }

    /// What the locker read when it was built ([`RedisLocker::server_facts`]):
    /// `appendonly no` (a restart forgets marks and fence counters: see
    /// [`ServerFacts`](super::ServerFacts)), `appendfsync no`, replicas without
    /// [`Config::min_replicas`](super::Config::min_replicas), or settings it could not read. Asking
    /// counts as reporting them: the first mark write then does not log
    /// them again.
    fn durability_warnings(&self) -> Vec<String> {
        self.inner
            .durability_reported
            .store(true, Ordering::Relaxed);
        self.durability_report()
    }

    /// One read-only script: the lock key's value (held or not), its `PTTL`
    /// and its holder record (see the [module docs](super), "Inspection").
    /// Bounded like every call.
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        Ok(self.inspect_view(key).await?.map(|view| view.held))
    }

    /// `SCAN ... MATCH <prefix>{<escaped prefix>*}` over the whole key space
    /// (every master of a cluster), then one inspect script per lock found;
    /// each round trip bounded like every call (see the [module
    /// docs](super), "Inspection").
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let views = self.list_views(prefix).await?;
        Ok(views.into_iter().map(|view| view.held).collect())
    }

    /// [`ForceRelease::Lock`] only (one script deletes the lock and its
    /// record and publishes the release); [`ForceRelease::TerminateSession`]
    /// is [`Error::Unsupported`]: a Redis lock outlives its client's
    /// connection. Bounded like every call.
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        let delete = async { Ok(self.delete_lock(key).await?.map(|view| view.held)) };
        crate::inspect::release_by_deleting(BACKEND, key, how, "a key", delete).await
    }

    /// Subscribes to `key`'s release channel on the locker's shared subscriber
    /// connection. If subscribing fails, waiters poll (`Ok(None)`): the
    /// attempts that follow report any outage.
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        validate::key(key)?;
        match self.inner.releases.watch(self.release_channel(key)).await {
            Ok(watch) => Ok(Some(watch)),
            Err(error) if error.code() == Some("NOPERM") => {
                tracing::warn!(component = "distlock", backend = BACKEND, key, %error,
                    "this user may not subscribe to release channels; waiters poll");
                Ok(None)
            }
            Err(error) => {
                tracing::debug!(component = "distlock", backend = BACKEND, key, %error,
                    "cannot subscribe to release notifications; polling");
                Ok(None)
            }
        }
    }
}
