//! Waiting for a lock, written once for every backend: jittered exponential
//! backoff bounded by the deadline, woken early by a backend's release
//! notifications where it has them.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{Stream, StreamExt};
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::deadline::{bounded, checked_deadline, sleep_until};
use crate::forward::{forward_to_inner, inner_accessors};
use crate::inspect::{ForceRelease, HeldLock};
use crate::util;
use crate::{
    Capabilities, Error, Lease, Locker, MarkAdvance, RefreshRequest, Result, DEADLINE_GRACE,
};

/// How [`Locker::lock`] polls between attempts.
///
/// Delays grow from `initial_delay` by `multiplier` up to `max_delay`; each
/// sleep (at least 1 ms) is drawn uniformly from the upper half of the current delay (jitter,
/// so waiters that missed the same release do not retry in lockstep) and never
/// passes the deadline. Where the backend notifies releases, a notification
/// cuts the sleep short, so polling only matters for locks freed by expiry or
/// by a holder's crash.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WaitPolicy {
    initial_delay: Duration,
    max_delay: Duration,
    multiplier: f64,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy {
            initial_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(200),
            multiplier: 2.0,
        }
    }
}

impl WaitPolicy {
    /// First delay between attempts (default 5 ms).
    pub fn initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = delay;
        self
    }

    /// Largest delay between attempts (default 200 ms).
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Growth factor of the delay (default 2).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a factor that is not a finite number of
    /// at least 1 (NaN, infinity, 0.5): a shrinking or undefined backoff is a
    /// mistake, not a policy.
    ///
    /// ```
    /// use distlock::WaitPolicy;
    /// assert!(WaitPolicy::default().multiplier(1.5).is_ok());
    /// assert!(WaitPolicy::default().multiplier(f64::NAN).is_err());
    /// ```
    pub fn multiplier(mut self, multiplier: f64) -> Result<Self> {
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(Error::invalid(
                "wait policy",
                format!("the backoff multiplier is {multiplier}; it must be a finite number of at least 1"),
            ));
        }
        self.multiplier = multiplier;
        Ok(self)
    }

    /// The delay after `current`: grown by the multiplier, capped at
    /// `max_delay`, saturating instead of overflowing.
    fn next_delay(&self, current: Duration) -> Duration {
        Duration::try_from_secs_f64(current.as_secs_f64() * self.multiplier)
            .map_or(self.max_delay, |grown| grown.min(self.max_delay))
    }
}

/// A backend's notification stream of releases of one key; see
/// [`Locker::watch_releases`]. Each item means "the key may have been
/// released: try again". A stream that ends means notifications stopped (for
/// example the connection carrying them died); waiters then poll.
pub struct ReleaseWatch {
    events: Pin<Box<dyn Stream<Item = ()> + Send>>,
}

impl ReleaseWatch {
    /// Wraps a stream of release events (backend implementors only).
    pub fn from_stream(events: impl Stream<Item = ()> + Send + 'static) -> Self {
        ReleaseWatch {
            events: Box::pin(events),
        }
    }

    /// Waits for the next release event; `false` if the stream ended.
    pub async fn next(&mut self) -> bool {
        self.events.next().await.is_some()
    }

    /// One watch of the releases of all of `watches` (a semaphore's
    /// permits): an event of any of them is an event, and it ends when all
    /// have ended. `None` for none.
    pub(crate) fn merge(watches: Vec<ReleaseWatch>) -> Option<ReleaseWatch> {
        (!watches.is_empty()).then(|| ReleaseWatch {
            events: Box::pin(futures_util::stream::select_all(
                watches.into_iter().map(|watch| watch.events),
            )),
        })
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch").finish_non_exhaustive()
    }
}

/// Acquires `key`, waiting up to `timeout` under `policy`: the implementation
/// of [`Locker::lock`] for every backend without a server-side wait.
///
/// Returns within `timeout` + [`DEADLINE_GRACE`]: each attempt (and the
/// subscription) is bounded by what is left of that, and one still unanswered
/// then is abandoned with [`Error::DeadlineExceeded`] (backends make their
/// attempts cancel-safe, undoing one that may have taken effect). A timeout
/// too long to represent waits for ever.
pub(crate) async fn acquire<L: Locker + ?Sized>(
    locker: &L,
    key: &str,
    ttl: Duration,
    timeout: Duration,
    policy: &WaitPolicy,
) -> Result<Lease> {
    acquire_as(locker, key, ttl, timeout, policy, false).await
}

/// [`acquire`] of an exclusive lease, or with `shared` a shared one: the
/// implementation of [`Locker::lock_shared`] for every backend without a
/// server-side wait. Both are woken by the same release notifications: the
/// release of a writer or of a reader may each let the other kind in.
pub(crate) async fn acquire_as<L: Locker + ?Sized>(
    locker: &L,
    key: &str,
    ttl: Duration,
    timeout: Duration,
    policy: &WaitPolicy,
    shared: bool,
) -> Result<Lease> {
    crate::validate::acquire(key, ttl)?;
    let attempt = || async move {
        match shared {
            true => locker.try_lock_shared(key, ttl).await,
            false => locker.try_lock(key, ttl).await,
        }
    };
    acquire_with(
        locker.backend(),
        key,
        timeout,
        policy,
        attempt,
        locker.watch_releases(key),
    )
    .await
}

/// A backend whose waiters queue on the server (etcd, ZooKeeper): one
/// acquire serves a single attempt and a wait alike, and
/// [`try_in_queue`] and [`lock_in_queue`] bound it.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) trait Queue: Locker {
    /// What a contender queues as: a writer or a reader.
    type Kind: Send;

    /// The bound on one attempt (the backend's `operation_bound`).
    fn attempt_bound(&self) -> Duration;

    /// One acquire, as `request` says. `Ok(None)` is contention (or, when
    /// waiting, the deadline).
    fn acquire(
        &self,
        request: Acquire<'_, Self::Kind>,
    ) -> impl std::future::Future<Output = Result<Option<Lease>>> + Send;
}

/// One acquire a [`Queue`] backend is asked for.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) struct Acquire<'a, K> {
    pub(crate) key: &'a str,
    pub(crate) ttl: Duration,
    /// `None` for a single attempt, or the deadline (`None`: for ever) to
    /// wait in the queue until.
    pub(crate) wait: Option<Option<Instant>>,
    /// A writer or a reader.
    pub(crate) kind: K,
}

/// [`Locker::try_lock`] and [`Locker::try_lock_shared`] of a [`Queue`]
/// backend: one attempt of `kind` once `key` and `ttl` are valid, bounded
/// by [`Queue::attempt_bound`].
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) async fn try_in_queue<Q: Queue>(
    queue: &Q,
    key: &str,
    ttl: Duration,
    kind: Q::Kind,
) -> Result<Option<Lease>> {
    crate::validate::acquire(key, ttl)?;
    // One attempt: no wait in the queue.
    let attempt = queue.acquire(Acquire {
        key,
        ttl,
        wait: None,
        kind,
    });
    bounded(queue.backend(), "acquire", queue.attempt_bound(), attempt).await
}

/// [`Locker::lock`] and [`Locker::lock_shared`] of a [`Queue`] backend,
/// written once: a zero `timeout` is one attempt bounded by
/// [`Queue::attempt_bound`], contention [`Error::NotAcquired`]; otherwise a
/// wait in the queue until the deadline, bounded by `timeout` +
/// [`DEADLINE_GRACE`], reaching the deadline [`Error::Timeout`].
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) async fn lock_in_queue<Q: Queue>(
    queue: &Q,
    key: &str,
    ttl: Duration,
    timeout: Duration,
    kind: Q::Kind,
) -> Result<Lease> {
    crate::validate::acquire(key, ttl)?;
    let (wait, limit) = match timeout.is_zero() {
        true => (None, queue.attempt_bound()),
        false => (
            Some(checked_deadline(Instant::now(), timeout)),
            timeout.saturating_add(DEADLINE_GRACE),
        ),
    };
    let acquire = queue.acquire(Acquire {
        key,
        ttl,
        wait,
        kind,
    });
    match bounded(queue.backend(), "acquire", limit, acquire).await? {
        Some(lease) => Ok(lease),
        None if timeout.is_zero() => Err(Error::not_acquired(key)),
        None => Err(Error::Timeout {
            key: key.to_owned(),
            waited: timeout,
        }),
    }
}

/// The waiting loop of [`acquire`], over any single `attempt` (one
/// `try_lock`, or a semaphore's pass over its permits) and the `releases`
/// that say an attempt may now succeed: one attempt, then (if it found
/// everything held) the subscription, then attempts with jittered backoff,
/// woken early by a release. `key` names what is waited for in errors.
///
/// Returns within `timeout` + [`DEADLINE_GRACE`] (see [`acquire`]).
pub(crate) async fn acquire_with<A, F>(
    backend: &'static str,
    key: &str,
    timeout: Duration,
    policy: &WaitPolicy,
    attempt: A,
    releases: impl std::future::Future<Output = Result<Option<ReleaseWatch>>>,
) -> Result<Lease>
where
    A: Fn() -> F,
    F: std::future::Future<Output = Result<Option<Lease>>>,
{
    let started = Instant::now();
    let deadline = checked_deadline(started, timeout);
    // What is left of `timeout + grace`, the bound of the whole call.
    let left = || {
        deadline.map_or(Duration::MAX, |deadline| {
            deadline
                .saturating_duration_since(Instant::now())
                .saturating_add(DEADLINE_GRACE)
        })
    };
    let attempt = || bounded(backend, "acquire", left(), attempt());
    let timed_out = |now: Instant| Error::Timeout {
        key: key.to_owned(),
        waited: now.saturating_duration_since(started),
    };
    // Most locks are free: take it without paying for a subscription.
    if let Some(lease) = attempt().await? {
        return Ok(lease);
    }
    if timeout.is_zero() {
        return Err(Error::not_acquired(key));
    }
    // Held: subscribe, then try again before every wait. A release between a
    // failed attempt and the subscription is then caught by the next attempt
    // rather than missed (Redisson's lost wake-ups came from waiting on a
    // subscription made after the last attempt).
    let mut releases = bounded(backend, "watch releases", left(), releases).await?;
    let mut delay = policy.initial_delay;
    loop {
        if let Some(lease) = attempt().await? {
            return Ok(lease);
        }
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            return Err(timed_out(now));
        }
        // At least 1 ms: a zero delay would spin on the backend.
        let jittered = rand::rng()
            .random_range(delay / 2..=delay)
            .max(Duration::from_millis(1));
        let wake = match (checked_deadline(now, jittered), deadline) {
            (Some(wake), Some(deadline)) => Some(wake.min(deadline)),
            (wake, deadline) => wake.or(deadline),
        };
        if let Some(watch) = releases.as_mut() {
            tokio::select! {
                alive = watch.next() => if !alive {
                    // Notifications stopped because their connection died: most
                    // likely the backend just went down, so retrying at once
                    // would only meet the outage. Finish this backoff sleep.
                    tracing::debug!(component = "distlock", key, "release notifications ended; polling");
                    releases = None;
                    sleep_until(wake).await;
                },
                () = sleep_until(wake) => {}
            }
        } else {
            sleep_until(wake).await;
        }
        delay = policy.next_delay(delay);
    }
}

/// A wrapper that makes [`Locker::lock`] wait under a custom [`WaitPolicy`].
///
/// It replaces the inner locker's own `lock`, including a server-side wait
/// (Postgres), with polling plus the inner locker's release notifications;
/// its [`Capabilities::release_wakeup`] says whether any are left
/// ([`Capabilities::release_notifications`] of the inner locker). A writer
/// polling here is queued nowhere, so new readers are not held back
/// ([`Capabilities::writer_priority`] is false).
#[derive(Debug)]
pub struct WaitLocker<L> {
    inner: Arc<L>,
    policy: WaitPolicy,
}

impl<L> Clone for WaitLocker<L> {
    fn clone(&self) -> Self {
        WaitLocker {
            inner: self.inner.clone(),
            policy: self.policy,
        }
    }
}

inner_accessors!(WaitLocker);

impl<L: Locker> WaitLocker<L> {
    /// Wraps `inner` so `lock` waits under `policy`.
    pub fn new(inner: L, policy: WaitPolicy) -> Self {
        WaitLocker {
            inner: Arc::new(inner),
            policy,
        }
    }
}

// Every method is written out or named in `forward_to_inner!`: a method
// added to `Locker` must be decided on here, not silently left to its
// default (as object_store's wrapper stores do).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: Locker> Locker for WaitLocker<L> {
    forward_to_inner!(backend, durability_warnings);
    fn capabilities(&self) -> Capabilities {
        let inner = self.inner.capabilities();
        Capabilities {
            // This `lock` is the shared loop: it wakes only on notifications,
            // whatever native wait the inner locker's own `lock` has.
            release_wakeup: inner.release_notifications,
            // And a writer polling in it is in no server's queue.
            writer_priority: false,
            ..inner
        }
    }
    fn backend_key(&self, key: &str) -> String {
        self.inner.backend_key(key)
    }
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.inner.try_lock(key, ttl).await
    }
    async fn lock(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        acquire(&*self.inner, key, ttl, timeout, &self.policy).await
    }
    async fn try_lock_any(&self, keys: &[String], ttl: Duration) -> Result<Option<Lease>> {
        self.inner.try_lock_any(keys, ttl).await
    }
    async fn try_lock_shared(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
        self.inner.try_lock_shared(key, ttl).await
    }
    /// Waits under this wrapper's policy, as its `lock` does.
    async fn lock_shared(&self, key: &str, ttl: Duration, timeout: Duration) -> Result<Lease> {
        acquire_as(&*self.inner, key, ttl, timeout, &self.policy, true).await
    }
    async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
        self.inner.unlock(key, owner).await
    }
    async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> Result<()> {
        self.inner.refresh(key, owner, ttl).await
    }
    async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<Result<()>> {
        self.inner.refresh_many(requests).await
    }
    async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
        self.inner.watch_releases(key).await
    }
    async fn forget(&self, key: &str) -> Result<()> {
        self.inner.forget(key).await
    }
    async fn advance_mark(&self, name: &str, value: i64) -> Result<MarkAdvance> {
        self.inner.advance_mark(name, value).await
    }
    async fn inspect(&self, key: &str) -> Result<Option<HeldLock>> {
        self.inner.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.inner.list(prefix).await
    }
    async fn force_release(&self, key: &str, how: ForceRelease) -> Result<Option<HeldLock>> {
        self.inner.force_release(key, how).await
    }
}

/// In-process release notifications per key, for backends whose releases in
/// this process are seen by this process (memory, file, a Postgres session).
#[derive(Debug, Default)]
pub(crate) struct LocalReleases {
    channels: Mutex<HashMap<String, watch::Sender<()>>>,
}

/// Channels with no subscriber left are pruned once the map grows past this.
const PRUNE_AT: usize = 1024;

impl LocalReleases {
    pub(crate) fn subscribe(&self, key: &str) -> ReleaseWatch {
        let mut channels = util::lock(&self.channels);
        if channels.len() >= PRUNE_AT {
            channels.retain(|_, sender| sender.receiver_count() > 0);
        }
        let receiver = channels
            .entry(key.to_owned())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        ReleaseWatch::from_stream(futures_util::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.changed().await.ok().map(|()| ((), receiver)) },
        ))
    }

    pub(crate) fn notify(&self, key: &str) {
        let mut channels = util::lock(&self.channels);
        if let Some(sender) = channels.get(key) {
            if sender.receiver_count() == 0 {
                channels.remove(key);
            } else {
                sender.send_replace(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_the_cap() {
        let policy = WaitPolicy::default();
        let mut delay = policy.initial_delay;
        let mut seen = vec![delay];
        for _ in 0..8 {
            delay = policy.next_delay(delay);
            seen.push(delay);
        }
        assert_eq!(seen[1], Duration::from_millis(10));
        assert_eq!(*seen.last().unwrap(), Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_subscription_sees_a_release_sent_before_it_waits() {
        let releases = LocalReleases::default();
        let mut watch = releases.subscribe("k");
        releases.notify("k");
        let woke = tokio::time::timeout(Duration::from_secs(1), watch.next()).await;
        assert_eq!(woke, Ok(true));
    }

    /// Counts subscriptions of a memory locker.
    #[derive(Debug, Default)]
    struct Counting {
        inner: crate::memory::MemoryLocker,
        subscriptions: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl Locker for Counting {
        fn backend(&self) -> &'static str {
            "counting"
        }
        crate::forward::forward_to_inner!(capabilities);
        async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<Lease>> {
            self.inner.try_lock(key, ttl).await
        }
        async fn unlock(&self, key: &str, owner: &str) -> Result<()> {
            self.inner.unlock(key, owner).await
        }
        async fn watch_releases(&self, key: &str) -> Result<Option<ReleaseWatch>> {
            self.subscriptions
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.watch_releases(key).await
        }
    }

    #[tokio::test]
    async fn a_free_lock_is_taken_without_subscribing_and_a_held_one_subscribes_once() {
        use std::sync::atomic::Ordering::SeqCst;
        let locker = Counting::default();
        let ttl = Duration::from_secs(30);
        let held = locker.lock("k", ttl, Duration::from_secs(1)).await.unwrap();
        assert_eq!(locker.subscriptions.load(SeqCst), 0);
        let releaser = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            held.release().await.unwrap();
        };
        let (waited, ()) = tokio::join!(locker.lock("k", ttl, Duration::from_secs(5)), releaser);
        waited.expect("acquired after the release");
        assert_eq!(locker.subscriptions.load(SeqCst), 1);
    }

    #[test]
    fn notify_without_subscribers_forgets_the_channel() {
        let releases = LocalReleases::default();
        drop(releases.subscribe("k"));
        releases.notify("k");
        assert!(releases.channels.lock().unwrap().is_empty());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn extreme_ttls_and_timeouts_never_panic(
            ttl in crate::test_support::any_duration(),
            timeout in crate::test_support::any_duration(),
            initial in crate::test_support::any_duration(),
            max in crate::test_support::any_duration(),
        ) {
            crate::test_support::block_on_paused(async {
                let locker = crate::memory::MemoryLocker::new();
                let policy = WaitPolicy::default().initial_delay(initial).max_delay(max);
                let waiting = WaitLocker::new(locker.clone(), policy);
                // Free key: granted, or ttl rejected as invalid input.
                let free = locker.lock("free", ttl, timeout).await;
                assert!(free.is_ok() || matches!(free, Err(Error::InvalidInput { what: "ttl", .. })), "{free:?}");
                let _ = locker.try_lock("other", ttl).await;
                // Held key: waits (bounded here by a minute of virtual time) or times out.
                let _held = locker.try_lock("held", Duration::from_secs(3600)).await.unwrap();
                let wait = tokio::time::timeout(
                    Duration::from_secs(60),
                    waiting.lock("held", Duration::from_secs(1), timeout),
                )
                .await;
                if let Ok(outcome) = wait {
                    assert!(matches!(outcome, Err(Error::NotAcquired { .. } | Error::Timeout { .. })), "{outcome:?}");
                }
            });
        }

        #[test]
        fn backoff_multipliers_are_numbers_of_at_least_one(m in proptest::num::f64::ANY) {
            let policy = WaitPolicy::default().max_delay(Duration::MAX).multiplier(m);
            match policy {
                Ok(policy) => {
                    assert!(m.is_finite() && m >= 1.0);
                    let mut delay = Duration::from_secs(u64::MAX / 2);
                    for _ in 0..4 {
                        delay = policy.next_delay(delay);
                    }
                }
                Err(error) => {
                    assert!(!(m.is_finite() && m >= 1.0), "{m} refused: {error}");
                    assert!(matches!(error, Error::InvalidInput { what: "wait policy", .. }));
                }
            }
        }
    }

    /// A backend that never answers, declaring the capabilities it holds.
    #[derive(Debug)]
    struct Silent(Capabilities);

    #[async_trait]
    impl Locker for Silent {
        fn backend(&self) -> &'static str {
            "silent"
        }
        fn capabilities(&self) -> Capabilities {
            self.0
        }
        async fn try_lock(&self, _key: &str, _ttl: Duration) -> Result<Option<Lease>> {
            std::future::pending().await
        }
        async fn unlock(&self, _key: &str, _owner: &str) -> Result<()> {
            std::future::pending().await
        }
    }

    /// A backend that never answers cannot hold `lock` past its timeout
    /// plus the grace.
    #[tokio::test(start_paused = true)]
    async fn lock_returns_within_its_timeout_plus_the_grace_whatever_the_backend_does() {
        for timeout in [Duration::ZERO, Duration::from_secs(3)] {
            let started = Instant::now();
            let err = Silent(Capabilities::default())
                .lock("k", Duration::from_secs(10), timeout)
                .await
                .unwrap_err();
            assert_eq!(started.elapsed(), timeout + DEADLINE_GRACE);
            assert!(
                matches!(
                    err,
                    Error::DeadlineExceeded {
                        backend: "silent",
                        operation: "acquire",
                        ..
                    }
                ),
                "an unanswered attempt is an outage, not contention: {err}"
            );
        }
    }

    #[test]
    fn waiting_around_a_server_side_wait_reports_no_wakeup_it_does_not_have() {
        // A backend whose own `lock` waits on the server (as Postgres'),
        // with no release notifications.
        let server_wait = Silent(Capabilities {
            release_wakeup: true,
            release_notifications: false,
            ..Capabilities::default()
        });
        assert!(server_wait.capabilities().release_wakeup);
        let waiting = WaitLocker::new(server_wait, WaitPolicy::default());
        assert!(
            !waiting.capabilities().release_wakeup,
            "Waiting polls instead of the server-side wait"
        );
        let notifying = WaitLocker::new(crate::memory::MemoryLocker::new(), WaitPolicy::default());
        assert!(notifying.capabilities().release_wakeup);
    }
}
