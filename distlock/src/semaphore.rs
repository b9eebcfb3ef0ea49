//! Counting semaphores over any [`Locker`]: at most N holders of a name at
//! once, each holding a permit that is a [`Lease`] like any other.
//!
//! A semaphore `name` with N permits is N locks, its **permit keys**
//! `name#0` to `name#N-1`; holding a permit is holding one of them. So
//! every guarantee of a lock carries over, on every backend and through
//! every wrapper:
//!
//! - **At most N holders** among those that agree on N, as far as the
//!   backend's exclusion holds (see each backend's docs under a pause or a
//!   partition). Where a lock's holds can overlap, a permit's can, making
//!   N + 1 holders: a holder paused past its ttl on an expiring backend, a
//!   session the server ends before its holder hears. The fault suite
//!   measures it per backend (`RELIABILITY.md`, "The semaphore workload");
//!   the permit's fencing token is what rejects the late holder's writes.
//! - **A crashed holder's permit comes back** by the backend's own
//!   mechanism, within the same bound as a lock's: at once on session
//!   backends (file, Postgres, MySQL), at its ttl on expiring ones (Redis,
//!   etcd, Redlock). No permit count is kept anywhere that a crash could
//!   leave wrong (Redisson's `RSemaphore` leaks permits that way).
//! - **A permit is a lease**: owner token, fencing token, lost signal,
//!   keepalive with max hold, release, drop-safety; its key
//!   ([`Lease::key`]) is the permit key it holds. Fencing tokens strictly
//!   increase **per permit**, not across the semaphore: a resource that
//!   fences a semaphore's holders keeps the highest token per permit key.
//! - **Inspection**: [`Semaphore::holders`] reports every permit holder,
//!   and `distlock list --prefix 'name#'` lists them.
//! - **Observable**: each permit's acquire and release are lock operations
//!   of the locker, counted and traced by its [`MetricsLocker`](crate::MetricsLocker)
//!   and [`TraceLocker`](crate::TraceLocker) on the permit keys; beside
//!   them, `distlock_semaphore_acquires_total{semaphore, operation,
//!   outcome}` counts calls (`acquired`, `full`, `timeout` or an error
//!   kind) and `distlock_semaphore_permits_held{semaphore}` the permits this
//!   process holds, and a `distlock.semaphore` span covers each call.
//!
//! # Cost and order
//!
//! One attempt is one [`Locker::try_lock_any`] over the permit keys,
//! starting at a random one (so contenders spread out), plus, only when
//! every permit is held, one [`Locker::inspect`] of permit N (the check
//! below). So:
//!
//! | backend | round trips of a granted attempt | of an attempt that finds all N held |
//! | --- | --- | --- |
//! | Redis, one server or Sentinel: [`try_lock_any`](Locker::try_lock_any) is one script | 1 | 2 |
//! | the default, one key at a time ([`try_lock_in_turn`](crate::try_lock_in_turn)): backends without an attempt of their own (see each backend's docs), Redis Cluster, Redlock | 1 to N | N + 1 |
//!
//! A native attempt is thus **at most 2 round trips at any occupancy**
//! (`BENCHMARKS.md`, "Semaphores: permit cycles", measures both paths;
//! the Redis tests count the commands). Round trips are not the whole
//! cost: a native request carries all N keys, so where most of many
//! permits are free it can take longer than the default's one-key round
//! trip (see the Redis backend's docs, "Semaphores"). On a backend that cannot inspect
//! its locks the check is skipped, and a full attempt costs the
//! `try_lock_any` alone. Waiting polls with jittered backoff and wakes on
//! the permits' release notifications where the backend has them (for up
//! to [`MAX_WATCHED_PERMITS`] permits). Waiters are not served in order: a
//! released permit goes to whichever waiter tries it first.
//!
//! # Holders that disagree about N
//!
//! Each acquirer uses its own N: an acquirer with N = 5 may take permit
//! `name#4` while one with N = 3 believes at most 3 may hold. So an
//! acquirer that finds all its N permits held also looks at permit N: if
//! that is held, some holder uses a larger limit, and the attempt fails
//! with [`Error::InvalidInput`] naming both instead of waiting in a
//! semaphore whose limit it cannot enforce. (On a backend that cannot
//! inspect its locks this check is skipped.) Use one limit per name.
//!
//! ```
//! use std::time::Duration;
//! use distlock::semaphore::Semaphore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let locker = distlock::connect("memory://").await?;
//! // At most 3 replicas call the partner API at once.
//! let partner_api = Semaphore::new(locker, "partner-api", 3)?;
//! let permit = partner_api
//!     .acquire(Duration::from_secs(30), Duration::from_secs(10))
//!     .await?;
//! assert!(permit.key().starts_with("partner-api#"));
//! assert_eq!(partner_api.holders().await?.len(), 1);
//! permit.release().await?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge};
use rand::Rng;
use tracing::Instrument;

use crate::inspect::HeldLock;
use crate::wait::{acquire_with, ReleaseWatch, WaitPolicy};
use crate::{validate, Error, Lease, Locker, Result};

/// The most permits a semaphore may have: each is a lock, and a full
/// semaphore costs a round trip per permit to try on a backend without a
/// native attempt (see "Cost and order" in the [module docs](self)).
pub const MAX_PERMITS: u32 = crate::validate::MAX_KEYS_PER_ATTEMPT as u32;

/// Up to this many permits, a waiter subscribes to each permit's release
/// notifications; a semaphore with more only polls.
pub const MAX_WATCHED_PERMITS: u32 = 16;

/// A named semaphore of N permits on a [`Locker`] (see the
/// [module docs](self)). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Semaphore {
    locker: Arc<dyn Locker>,
    name: String,
    permits: u32,
    policy: WaitPolicy,
}

impl Semaphore {
    /// The semaphore `name` with `permits` permits on `locker`: any
    /// [`Locker`], a backend, a wrapped one, or an `Arc<dyn Locker>` shared
    /// with the rest of the program (kept as it is, not boxed again).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for zero permits or more than
    /// [`MAX_PERMITS`], or a name that is empty or whose permit keys would
    /// be too long for a key.
    pub fn new(locker: impl Locker, name: impl Into<String>, permits: u32) -> Result<Self> {
        let name = name.into();
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(Error::invalid(
                "permits",
                format!("{permits} permits: a semaphore has 1 to {MAX_PERMITS}"),
            ));
        }
        validate::key(&name)?;
        validate::key(&permit_key(&name, permits - 1))?;
        Ok(Semaphore {
            locker: crate::lease::into_shared(locker),
            name,
            permits,
            policy: WaitPolicy::default(),
        })
    }

    /// How waiting polls (default [`WaitPolicy::default`]).
    pub fn wait_policy(mut self, policy: WaitPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The key of permit `index` (`name#index`): the lock a holder of that
    /// permit holds.
    pub fn permit_key(&self, index: u32) -> String {
        permit_key(&self.name, index)
    }

    /// One attempt: a permit for `ttl` if one is free, `None` if all are
    /// held.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a ttl the backend refuses, or when all
    /// permits are held and so is permit N (a holder uses a larger limit,
    /// see the [module docs](self)); a backend error if it failed.
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::try_lock`]: a permit granted by an attempt that is
    /// dropped is released (or lapses with its ttl or session).
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Option<Lease>> {
        let attempt = self.attempt(ttl).instrument(self.span("try_acquire")).await;
        let outcome = match &attempt {
            Ok(Some(_)) => "acquired",
            Ok(None) => "full",
            Err(error) => error.kind_name(),
        };
        self.counted("try_acquire", outcome);
        attempt.map(|permit| permit.map(|lease| self.held(lease)))
    }

    /// One pass over the permits (see [`try_acquire`](Self::try_acquire)).
    async fn attempt(&self, ttl: Duration) -> Result<Option<Lease>> {
        validate::ttl(ttl)?;
        let first = rand::rng().random_range(0..self.permits);
        let keys: Vec<String> = (0..self.permits)
            .map(|offset| self.permit_key((first + offset) % self.permits))
            .collect();
        if let Some(lease) = self.locker.try_lock_any(&keys, ttl).await? {
            return Ok(Some(lease));
        }
        self.refuse_a_larger_limit().await?;
        Ok(None)
    }

    fn span(&self, operation: &'static str) -> tracing::Span {
        tracing::debug_span!("distlock.semaphore", semaphore = %self.name, permits = self.permits, operation)
    }

    /// Counts a call's outcome (`acquired`, `full`, `timeout` or an error
    /// kind).
    fn counted(&self, operation: &'static str, outcome: &'static str) {
        counter!(
            "distlock_semaphore_acquires_total",
            "semaphore" => self.name.clone(),
            "operation" => operation,
            "outcome" => outcome
        )
        .increment(1);
    }

    /// Counts a granted permit as held by this process until its lease
    /// ends.
    fn held(&self, lease: Lease) -> Lease {
        let name = self.name.clone();
        gauge!("distlock_semaphore_permits_held", "semaphore" => name.clone()).increment(1.0);
        lease.on_end(move |_| {
            gauge!("distlock_semaphore_permits_held", "semaphore" => name).decrement(1.0);
        });
        lease
    }

    /// Waits up to `timeout` for a permit (zero: one attempt; a timeout too
    /// long to represent waits for ever), waking on the permits' release
    /// notifications where the backend has them.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (or [`Error::NotAcquired`] for a zero timeout) if
    /// every permit stayed held; otherwise as
    /// [`try_acquire`](Self::try_acquire). Returns within `timeout` +
    /// [`DEADLINE_GRACE`](crate::DEADLINE_GRACE).
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::lock`].
    pub async fn acquire(&self, ttl: Duration, timeout: Duration) -> Result<Lease> {
        let acquired = async {
            validate::ttl(ttl)?;
            acquire_with(
                self.locker.backend(),
                &self.name,
                timeout,
                &self.policy,
                || self.attempt(ttl),
                self.watch_releases(),
            )
            .await
        }
        .instrument(self.span("acquire"))
        .await;
        let outcome = match &acquired {
            Ok(_) => "acquired",
            Err(Error::Timeout { .. } | Error::NotAcquired { .. }) => "timeout",
            Err(error) => error.kind_name(),
        };
        self.counted("acquire", outcome);
        acquired.map(|lease| self.held(lease))
    }

    /// Every permit held now, by permit key (one inspection per permit).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] on a backend that cannot inspect its locks; a
    /// backend error if it failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn holders(&self) -> Result<Vec<HeldLock>> {
        let keys: Vec<String> = (0..self.permits).map(|i| self.permit_key(i)).collect();
        let mut held = Vec::new();
        // A bounded number of reads at a time.
        for chunk in keys.chunks(64) {
            let found =
                futures_util::future::join_all(chunk.iter().map(|key| self.locker.inspect(key)))
                    .await;
            for lock in found {
                held.extend(lock?);
            }
        }
        Ok(held)
    }

    /// Fails if permit N (one past this semaphore's last) is held: see
    /// "Holders that disagree about N" in the [module docs](self).
    async fn refuse_a_larger_limit(&self) -> Result<()> {
        if !self.locker.capabilities().inspect {
            return Ok(());
        }
        let beyond = permit_key(&self.name, self.permits);
        if validate::key(&beyond).is_err() {
            return Ok(());
        }
        match self.locker.inspect(&beyond).await? {
            Some(_) => Err(Error::invalid(
                "permits",
                format!(
                    "semaphore {:?} has {} permits here, but permit {beyond:?} is held: \
                     another holder uses a larger limit; use the same limit everywhere",
                    self.name, self.permits
                ),
            )),
            None => Ok(()),
        }
    }

    /// The permits' release notifications, merged (see
    /// [`MAX_WATCHED_PERMITS`]).
    async fn watch_releases(&self) -> Result<Option<ReleaseWatch>> {
        if self.permits > MAX_WATCHED_PERMITS || !self.locker.capabilities().release_notifications {
            return Ok(None);
        }
        let mut watches = Vec::new();
        for index in 0..self.permits {
            watches.extend(self.locker.watch_releases(&self.permit_key(index)).await?);
        }
        Ok(ReleaseWatch::merge(watches))
    }
}

fn permit_key(name: &str, index: u32) -> String {
    format!("{name}#{index}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLocker;
    use crate::LockerExt;

    const TTL: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn the_n_plus_first_attempt_finds_every_permit_held() {
        let semaphore = Semaphore::new(MemoryLocker::new().shared(), "api", 3).expect("valid");
        let mut permits = Vec::new();
        for _ in 0..3 {
            permits.push(
                semaphore
                    .try_acquire(TTL)
                    .await
                    .expect("try")
                    .expect("free"),
            );
        }
        let mut keys: Vec<&str> = permits.iter().map(Lease::key).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["api#0", "api#1", "api#2"]);
        assert!(semaphore.try_acquire(TTL).await.expect("try").is_none());
        assert_eq!(semaphore.holders().await.expect("holders").len(), 3);
        let freed = permits.pop().expect("a permit");
        let key = freed.key().to_owned();
        freed.release().await.expect("release");
        let again = semaphore
            .try_acquire(TTL)
            .await
            .expect("try")
            .expect("freed");
        assert_eq!(again.key(), key, "the only free permit");
    }

    #[test]
    fn a_limit_outside_one_to_max_is_refused() {
        let locker = MemoryLocker::new().shared();
        for permits in [0, MAX_PERMITS + 1] {
            let refused = Semaphore::new(locker.clone(), "api", permits).expect_err("refused");
            assert!(refused.to_string().contains("permits"), "{refused}");
        }
        assert!(Semaphore::new(locker.clone(), "", 1).is_err(), "empty name");
        let long = "k".repeat(crate::validate::MAX_KEY_LEN - 1);
        assert!(
            Semaphore::new(locker, long, 10).is_err(),
            "its permit keys would be too long"
        );
    }

    #[tokio::test]
    async fn a_holder_with_a_larger_limit_is_named_not_waited_for() {
        let locker = MemoryLocker::new().shared();
        let small = Semaphore::new(locker.clone(), "api", 1).expect("valid");
        let large = Semaphore::new(locker, "api", 2).expect("valid");
        let first = small.try_acquire(TTL).await.expect("try").expect("free");
        let second = large
            .try_acquire(TTL)
            .await
            .expect("try")
            .expect("one free");
        assert_eq!((first.key(), second.key()), ("api#0", "api#1"));
        let refused = small
            .acquire(TTL, Duration::from_secs(5))
            .await
            .expect_err("a larger limit is in use");
        let message = refused.to_string();
        assert!(message.contains("\"api#1\" is held"), "{message}");
        assert!(message.contains("same limit"), "{message}");
    }
}
