//! Opt-in automatic refresh of a held lease ([`crate::Lease::keep_alive`]).
//!
//! The renewal is tied to the lease: it stops when the lease is released or
//! dropped (a watchdog that outlives the unlock would keep the lock forever),
//! it signals loss instead of letting the holder work on without the lock, and
//! `max_hold` bounds it so a hung holder cannot keep a lock forever.
//!
//! One scheduler task per locker (and per runtime, where one locker is
//! shared by several) renews all of that locker's kept-alive leases: a timer queue ordered by when each lease is next due, and the
//! refreshes that fall due together sent as one
//! [`Locker::refresh_many`] batch, which backends turn into one round trip
//! (Redis: one script per Cluster slot; Postgres: one statement per
//! session). A task and a round trip per lease per ttl/3 cost 0.9 KiB a
//! lease and 30,000 round trips a second for 100,000 leases held for 10 s;
//! batched, the keepalive of a lease is one queue entry.
//!
//! "The same locker" is the same `Arc<dyn Locker>` the leases refresh
//! through: backends and wrappers hand every lease of one locker the same
//! one; a locker that builds a new `Arc` per
//! lease still works, with a scheduler (and no batching) per lease.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::signal::{extend_validity, mark_lost, mark_lost_with_grace, LostReason, StatusSender};
use crate::deadline::{checked_deadline, sleep_until};
use crate::{Error, Locker, RefreshRequest};

/// Settings of a lease's background refresh.
///
/// ```
/// use std::time::Duration;
/// use distlock::KeepAlive;
///
/// let keepalive = KeepAlive::default().max_hold(Duration::from_secs(3600));
/// assert_eq!(keepalive.interval_for(Duration::from_secs(30)), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Default)]
pub struct KeepAlive {
    interval: Option<Duration>,
    max_hold: Option<Duration>,
}

impl KeepAlive {
    /// Refresh every `interval` instead of every ttl/3. It should stay well
    /// under the ttl so a failed refresh can be retried before expiry.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Stop renewing once the lease has been held this long (counted from the
    /// grant): the lost signal fires with [`LostReason::MaxHoldExceeded`] and
    /// refreshing stops. The lock is **not** released then: it stays held
    /// until the holder, having stopped its work, releases it (or drops the
    /// lease), or until its ttl runs out where locks expire. So a lock is
    /// never freed under running work; [`crate::with_lock`] and
    /// `distlock run` stop the work and then release. A `max_hold` too long
    /// to represent means no maximum.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The refresh interval used for a lease of `ttl`.
    pub fn interval_for(&self, ttl: Duration) -> Duration {
        interval_for(self.interval, ttl)
    }
}

fn interval_for(interval: Option<Duration>, ttl: Duration) -> Duration {
    interval.unwrap_or(ttl / 3).max(Duration::from_millis(1))
}

/// The most refreshes of expiring leases sent in one
/// [`Locker::refresh_many`] call: a few hundred kilobytes of request at
/// most, and a script that keeps the server (Redis runs one script at a
/// time) busy for about a millisecond, not longer.
const MAX_BATCH: usize = 1000;

/// How much earlier than due the refresh of an expiring lease may be sent to
/// join a batch that is going out anyway: a tenth of its interval, at most
/// this. Refreshing early only renews sooner; it lets leases granted close
/// together settle into the same batches.
const MAX_EARLY: Duration = Duration::from_secs(1);

/// The most batches of one scheduler on their way at once. While that many
/// are out, due refreshes wait and gather into the next batch: a burst of
/// new keepalives (all of them overdue, say) becomes a few large batches
/// instead of a storm of small ones, and a slow server gets no more than
/// this many requests queued from the keepalive.
const MAX_IN_FLIGHT: usize = 4;

/// How far ahead a batch collects leases whose locks do not expire
/// (Postgres, MySQL, etcd, file: their refresh only confirms the hold, and
/// confirming it sooner costs no safety): up to half their interval, at most
/// this. Their batches have no size limit: Postgres confirms a session's
/// holds with one scan of `pg_locks`, whose cost grows with every lock on
/// the server, so one big batch per session beats many small ones.
const MAX_EARLY_UNEXPIRING: Duration = Duration::from_secs(30);

/// What a lease's keepalive needs, handed to its locker's scheduler.
pub(super) struct Entry {
    pub(super) status: StatusSender,
    pub(super) key: Arc<str>,
    pub(super) owner: Arc<str>,
    pub(super) interval: Option<Duration>,
    /// When renewal stops ([`KeepAlive::max_hold`] after the grant).
    pub(super) max_hold_at: Option<Instant>,
}

impl Entry {
    pub(super) fn new(
        status: StatusSender,
        key: Arc<str>,
        owner: Arc<str>,
        acquired_at: Instant,
        config: &KeepAlive,
    ) -> Self {
        Entry {
            status,
            key,
            owner,
            interval: config.interval,
            max_hold_at: config
                .max_hold
                .and_then(|hold| checked_deadline(acquired_at, hold)),
        }
    }
}

/// A lease's place in its locker's scheduler: dropping it stops the lease's
/// keepalive (the lease drops it on release, on drop, and when a new
/// keepalive replaces this one).
pub(super) struct Registration {
    scheduler: Arc<Scheduler>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // A closed scheduler has nothing left to stop.
        let _ = self.scheduler.commands.send(Command::Remove(self.id));
    }
}

impl Registration {
    /// Starts renewing `entry` on `locker`'s scheduler for `runtime`
    /// (started there if none runs).
    pub(super) fn start(
        locker: &Arc<dyn Locker>,
        entry: Entry,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let scheduler = Scheduler::of(locker, runtime);
        let id = scheduler.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::error::SendError(_)) = scheduler.commands.send(Command::Add(id, entry)) {
            // Only if its runtime shut down between the lookup and now; the
            // lease then expires unrenewed and its signal says so.
            tracing::warn!(
                component = "distlock",
                "keepalive scheduler stopped with its runtime; the lease is not renewed"
            );
        }
        Registration { scheduler, id }
    }

    /// The scheduler task's handle, for tests that check how it ended.
    #[cfg(test)]
    pub(super) fn take_task_for_test(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.scheduler
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

enum Command {
    Add(u64, Entry),
    Remove(u64),
}

/// The handle of one locker's scheduler task; the task ends once every
/// registration (and so every handle) is gone.
struct Scheduler {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicU64,
    #[cfg(test)]
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The running schedulers, by the address of the locker they renew through
/// and the runtime they run on. The task holds that `Arc`, so the address
/// cannot be reused by another locker while its scheduler runs; a handle
/// whose task ended (its runtime shut down) is replaced.
///
/// One per runtime, not one per locker: a scheduler's task ends with its
/// runtime, and with it every lease it renews, so a locker shared by two
/// runtimes must not have the leases of one renewed by the other's (they
/// would stop, unrenewed and never checked for max hold, when the other
/// runtime ends or merely stops being driven, as an idle current-thread
/// runtime is).
static SCHEDULERS: LazyLock<Mutex<Schedulers>> = LazyLock::new(Mutex::default);

#[derive(Default)]
struct Schedulers {
    by_locker: HashMap<(usize, tokio::runtime::Id), Weak<Scheduler>>,
    prune_at: usize,
}

impl Scheduler {
    fn of(locker: &Arc<dyn Locker>, runtime: &tokio::runtime::Handle) -> Arc<Scheduler> {
        let address = (Arc::as_ptr(locker).cast::<()>() as usize, runtime.id());
        let mut schedulers = SCHEDULERS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = schedulers.by_locker.get(&address).and_then(Weak::upgrade) {
            if !running.commands.is_closed() {
                return running;
            }
        }
        let (commands, receiver) = mpsc::unbounded_channel();
        let task = Task {
            locker: locker.clone(),
            commands: receiver,
            entries: HashMap::new(),
            queue: BinaryHeap::new(),
            in_flight: FuturesUnordered::new(),
        };
        let _task = runtime.spawn(task.run());
        let scheduler = Arc::new(Scheduler {
            commands,
            next_id: AtomicU64::new(0),
            #[cfg(test)]
            task: Mutex::new(Some(_task)),
        });
        if schedulers.by_locker.len() >= schedulers.prune_at {
            schedulers
                .by_locker
                .retain(|_, running| running.strong_count() > 0);
            schedulers.prune_at = (schedulers.by_locker.len() * 2).max(64);
        }
        schedulers
            .by_locker
            .insert(address, Arc::downgrade(&scheduler));
        scheduler
    }
}

/// A lease the scheduler renews.
struct Scheduled {
    entry: Entry,
    /// Set after a transient failure: the next try comes sooner than the
    /// interval, so several fit before the lease would expire.
    retry_at: Option<Instant>,
    /// A refresh of it is on its way; it is queued again when that settles.
    in_flight: bool,
}

type BatchFuture = Pin<Box<dyn Future<Output = Settled> + Send>>;

/// A batch's answers: for each lease, the ttl it was refreshed for and the
/// outcome.
struct Settled {
    started: Instant,
    leases: Vec<(u64, Duration, Duration)>,
    results: Vec<crate::Result<()>>,
}

struct Task {
    locker: Arc<dyn Locker>,
    commands: mpsc::UnboundedReceiver<Command>,
    entries: HashMap<u64, Scheduled>,
    /// When each lease needs looking at next (its refresh, retry or max
    /// hold), soonest first. An entry whose schedule moved (a refresh
    /// through the lease itself) is found early and queued again.
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    in_flight: FuturesUnordered<BatchFuture>,
}

/// What to do with a lease whose time came.
enum Next {
    Refresh {
        ttl: Duration,
        interval: Duration,
        expires: bool,
    },
    At(Instant),
    Never,
}

impl Task {
    async fn run(mut self) {
        loop {
            // With every batch slot taken, nothing can be sent: wait for an
            // answer (or a command), not for the due time.
            let wake = if self.in_flight.len() < MAX_IN_FLIGHT {
                self.queue.peek().map(|Reverse((at, _))| *at)
            } else {
                None
            };
            tokio::select! {
                biased;
                command = self.commands.recv() => match command {
                    Some(Command::Add(id, entry)) => self.add(id, entry),
                    Some(Command::Remove(id)) => {
                        self.entries.remove(&id);
                    }
                    // Every lease of this locker stopped its keepalive.
                    None => return,
                },
                Some(settled) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.settle(settled);
                }
                () = sleep_until(wake) => {}
            }
            // Take every command already queued before looking at what is
            // due, so a burst of registrations goes out together.
            while let Ok(command) = self.commands.try_recv() {
                match command {
                    Command::Add(id, entry) => self.add(id, entry),
                    Command::Remove(id) => {
                        self.entries.remove(&id);
                    }
                }
            }
            self.send_due();
        }
    }

    fn add(&mut self, id: u64, entry: Entry) {
        let scheduled = Scheduled {
            entry,
            retry_at: None,
            in_flight: false,
        };
        // Scheduled from the grant or the last refresh (whoever made it),
        // not from when the keepalive started.
        if let Some(at) = wake_at(&scheduled) {
            self.queue.push(Reverse((at, id)));
        }
        self.entries.insert(id, scheduled);
    }

    /// Ends the leases whose max hold or validity passed and sends the
    /// refreshes that are due, with those due within their early margin.
    fn send_due(&mut self) {
        let now = Instant::now();
        let horizon = checked_deadline(now, MAX_EARLY.max(MAX_EARLY_UNEXPIRING)).unwrap_or(now);
        let mut batch: Vec<(u64, Duration, Duration)> = Vec::new();
        let mut expiring = 0usize;
        let mut requeue = Vec::new();
        while let Some(&Reverse((at, id))) = self.queue.peek() {
            // Leases not yet due are looked at only to join a batch.
            if at > now && (batch.is_empty() || at > horizon) {
                break;
            }
            if batch.is_empty() && self.in_flight.len() >= MAX_IN_FLIGHT {
                break;
            }
            self.queue.pop();
            match self.next(id, now) {
                Next::Refresh {
                    ttl,
                    interval,
                    expires,
                } => {
                    batch.push((id, ttl, interval));
                    expiring += usize::from(expires);
                    if expiring == MAX_BATCH {
                        self.send(std::mem::take(&mut batch));
                        expiring = 0;
                    }
                }
                Next::At(at) => requeue.push(Reverse((at, id))),
                Next::Never => {}
            }
        }
        if !batch.is_empty() {
            self.send(batch);
        }
        self.queue.extend(requeue);
    }

    /// Looks at lease `id` at `now`: ends it if its max hold or validity
    /// passed, otherwise says whether its refresh is due.
    fn next(&mut self, id: u64, now: Instant) -> Next {
        let Some(scheduled) = self.entries.get(&id) else {
            return Next::Never;
        };
        if scheduled.in_flight {
            return Next::Never;
        }
        let entry = &scheduled.entry;
        let status = entry.status.status();
        if status.lost.is_some() {
            self.entries.remove(&id);
            return Next::Never;
        }
        if entry.max_hold_at.is_some_and(|max| now >= max) {
            tracing::warn!(
                component = "distlock",
                key = &*entry.key,
                "lease reached its max hold; renewal stops and the holder must stop its work and release"
            );
            mark_lost(&entry.status, LostReason::MaxHoldExceeded);
            self.entries.remove(&id);
            return Next::Never;
        }
        if status.valid_until.is_some_and(|until| now >= until) {
            tracing::warn!(
                component = "distlock",
                key = &*entry.key,
                "lease expired before a refresh succeeded"
            );
            mark_lost(&entry.status, LostReason::Expired);
            self.entries.remove(&id);
            return Next::Never;
        }
        let interval = interval_for(entry.interval, status.ttl);
        let due = scheduled
            .retry_at
            .or_else(|| checked_deadline(status.renewed_at, interval));
        let expires = status.valid_until.is_some();
        let early = if expires {
            (interval / 10).min(MAX_EARLY)
        } else {
            (interval / 2).min(MAX_EARLY_UNEXPIRING)
        };
        let latest = checked_deadline(now, early).unwrap_or(now);
        match due {
            Some(due) if due <= latest => Next::Refresh {
                ttl: status.ttl,
                interval,
                expires,
            },
            _ => match wake_at(scheduled) {
                Some(at) => Next::At(at),
                None => Next::Never,
            },
        }
    }

    /// Sends one batch; [`Task::settle`] takes its answers.
    fn send(&mut self, leases: Vec<(u64, Duration, Duration)>) {
        let mut owned = Vec::with_capacity(leases.len());
        for &(id, ttl, _) in &leases {
            if let Some(scheduled) = self.entries.get_mut(&id) {
                scheduled.in_flight = true;
                owned.push((
                    scheduled.entry.key.clone(),
                    scheduled.entry.owner.clone(),
                    ttl,
                ));
            }
        }
        // Every lease in it would still be valid this long: a batch that
        // takes longer is abandoned and retried, as a single refresh was.
        let bound = leases
            .iter()
            .map(|&(_, _, interval)| interval)
            .min()
            .unwrap_or(Duration::ZERO);
        let locker = self.locker.clone();
        self.in_flight.push(Box::pin(async move {
            let started = Instant::now();
            let requests: Vec<RefreshRequest<'_>> = owned
                .iter()
                .map(|(key, owner, ttl)| RefreshRequest {
                    key,
                    owner,
                    ttl: *ttl,
                })
                .collect();
            let results = match tokio::time::timeout(bound, locker.refresh_many(&requests)).await {
                Ok(results) => results,
                Err(_) => requests
                    .iter()
                    .map(|_| {
                        Err(Error::DeadlineExceeded {
                            backend: locker.backend(),
                            operation: "refresh",
                            after: bound,
                        })
                    })
                    .collect(),
            };
            Settled {
                started,
                leases,
                results,
            }
        }));
    }

    /// Applies a batch's answers to its leases and queues them again.
    fn settle(&mut self, settled: Settled) {
        let Settled {
            started,
            leases,
            results,
        } = settled;
        let mut results = results.into_iter();
        let mut failed = 0usize;
        let mut first_error = None;
        for (id, ttl, interval) in leases {
            let result = results.next().unwrap_or_else(|| {
                Err(Error::backend(
                    self.locker.backend(),
                    "refresh",
                    "refresh_many returned fewer results than requests",
                ))
            });
            let Some(scheduled) = self.entries.get_mut(&id) else {
                // Its keepalive stopped meanwhile.
                continue;
            };
            scheduled.in_flight = false;
            let entry = &scheduled.entry;
            match result {
                Ok(()) => {
                    if extend_validity(&entry.status, started, ttl).is_err() {
                        self.entries.remove(&id);
                        continue;
                    }
                    scheduled.retry_at = None;
                }
                Err(Error::NotHeld { .. }) => {
                    tracing::warn!(
                        component = "distlock",
                        key = &*entry.key,
                        "lock lost: refresh says it is no longer held"
                    );
                    mark_lost_with_grace(&entry.status, LostReason::NotHeld, Duration::ZERO);
                    self.entries.remove(&id);
                    continue;
                }
                Err(error @ (Error::Unsupported { .. } | Error::InvalidInput { .. })) => {
                    tracing::error!(component = "distlock", key = &*entry.key, %error, "keepalive stopped: refresh is impossible");
                    self.entries.remove(&id);
                    continue;
                }
                Err(error) => {
                    let retry_delay =
                        (interval / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    scheduled.retry_at = checked_deadline(Instant::now(), retry_delay);
                    failed += 1;
                    first_error.get_or_insert((error, retry_delay));
                }
            }
            if let Some(at) = wake_at(scheduled) {
                self.queue.push(Reverse((at, id)));
            }
        }
        if let Some((error, retry_delay)) = first_error {
            // Once per batch, not once per lease: an outage would otherwise
            // log every held lease at every retry.
            tracing::warn!(component = "distlock", leases = failed, %error, ?retry_delay, "refresh failed; retrying until the leases would expire");
        }
    }
}

/// When a lease is next due for a look: its refresh (or retry), or its max
/// hold if sooner; `None` if neither can be represented (never).
fn wake_at(scheduled: &Scheduled) -> Option<Instant> {
    let status = scheduled.entry.status.status();
    let interval = interval_for(scheduled.entry.interval, status.ttl);
    let due = scheduled
        .retry_at
        .or_else(|| checked_deadline(status.renewed_at, interval));
    match (due, scheduled.entry.max_hold_at) {
        (Some(due), Some(max)) => Some(due.min(max)),
        (due, max) => due.or(max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Flaky;
    use crate::LostReason;
    use std::sync::atomic::Ordering;

    const TTL: Duration = Duration::from_secs(3);

    /// A locker shared by two runtimes: the scheduler the first one started
    /// dies with it, and must not take the second one's leases along.
    #[test]
    fn a_lease_keeps_its_keepalive_when_another_runtime_ends() {
        let locker = crate::memory::MemoryLocker::new();
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let second = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("runtime");
        let mut started_first = first.block_on(async {
            let mut lease = locker.try_lock("a", TTL).await.unwrap().unwrap();
            lease.keep_alive(KeepAlive::default()).unwrap();
            lease
        });
        let lease = second.block_on(async {
            let mut lease = locker.try_lock("b", TTL).await.unwrap().unwrap();
            let max_hold = Duration::from_millis(300);
            lease
                .keep_alive(KeepAlive::default().max_hold(max_hold))
                .unwrap();
            lease
        });
        started_first.stop_keepalive();
        drop(first);
        let reason = second.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), lease.lost_signal().wait()).await
        });
        assert_eq!(
            reason,
            Ok(LostReason::MaxHoldExceeded),
            "the second runtime's lease is still watched after the first runtime ended"
        );
        drop(started_first);
        drop(lease);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_refresh_failures_are_retried_before_expiry() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
        flaky.down.store(true, Ordering::SeqCst);
        // Past the first refresh (at 1 s) and several retries, short of expiry.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(
            flaky.calls.load(Ordering::SeqCst) >= 3,
            "the keepalive retried"
        );
        assert_eq!(lease.lost_signal().reason(), None);
        flaky.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            lease.lost_signal().reason(),
            None,
            "a late success renewed the lease"
        );
        lease.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_backend_down_until_expiry_means_the_lease_is_lost() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
        flaky.down.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let reason = lease.lost_signal().wait().await;
        assert_eq!(reason, LostReason::Expired);
        let after = started.elapsed();
        assert!(after <= TTL, "lost reported at {after:?}, after the ttl");
        assert!(
            after >= TTL - Duration::from_millis(800),
            "lost reported early, at {after:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_keepalive_stops_when_the_lease_is_released() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
        lease.release().await.unwrap();
        let calls = flaky.calls.load(Ordering::SeqCst);
        tokio::time::sleep(TTL * 5).await;
        assert_eq!(
            flaky.calls.load(Ordering::SeqCst),
            calls,
            "no refresh after release"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn max_hold_stops_renewal_without_freeing_the_lock() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease
            .keep_alive(KeepAlive::default().max_hold(Duration::from_millis(1500)))
            .unwrap();
        let reason = lease.lost_signal().wait().await;
        assert_eq!(reason, LostReason::MaxHoldExceeded);
        assert!(
            flaky.inner.try_lock("k", TTL).await.unwrap().is_none(),
            "the work may still run: the lock stays held until released"
        );
        let calls = flaky.calls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(flaky.calls.load(Ordering::SeqCst), calls, "renewal stopped");
        lease.release().await.unwrap();
        assert!(flaky.inner.try_lock("k", TTL).await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_refresh_is_due_a_third_of_the_ttl_after_the_grant() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        let after_grant = flaky.calls.load(Ordering::SeqCst);
        // Started late: the refresh that was due at 1 s is overdue now.
        tokio::time::sleep(Duration::from_millis(1800)).await;
        lease.keep_alive(KeepAlive::default()).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            flaky.calls.load(Ordering::SeqCst),
            after_grant + 1,
            "refreshed at once, not 1 s after keep_alive() (past 2/3 of the ttl)"
        );
        assert_eq!(lease.lost_signal().reason(), None);
        lease.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_keepalive_follows_a_refresh_to_a_new_ttl() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease.keep_alive(KeepAlive::default()).unwrap();
        lease.refresh(Duration::from_secs(30)).await.unwrap();
        let calls = flaky.calls.load(Ordering::SeqCst);
        // Every 10 s now, counted from that refresh.
        tokio::time::sleep(Duration::from_millis(9900)).await;
        assert_eq!(flaky.calls.load(Ordering::SeqCst), calls);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(flaky.calls.load(Ordering::SeqCst), calls + 1);
        assert_eq!(lease.ttl(), Duration::from_secs(30));
        lease.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_max_hold_too_long_for_an_instant_means_no_max_hold() {
        let flaky = Flaky::default();
        let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
        lease
            .keep_alive(KeepAlive::default().max_hold(Duration::MAX))
            .unwrap();
        tokio::time::sleep(TTL * 10).await;
        assert_eq!(lease.lost_signal().reason(), None, "still renewed");
        lease.release().await.unwrap();
    }

    /// Memory, counting the keepalive's batches; its leases share one
    /// `Arc`, as every backend's do.
    #[derive(Debug, Clone, Default)]
    struct Batching {
        inner: crate::memory::MemoryLocker,
        batches: Arc<std::sync::atomic::AtomicUsize>,
        refreshed: Arc<std::sync::atomic::AtomicUsize>,
        leases: crate::SharedLocker,
    }

    #[async_trait::async_trait]
    impl Locker for Batching {
        fn backend(&self) -> &'static str {
            "batching"
        }
        fn capabilities(&self) -> crate::Capabilities {
            self.inner.capabilities()
        }
        async fn try_lock(&self, key: &str, ttl: Duration) -> crate::Result<Option<crate::Lease>> {
            let lease = self.inner.try_lock(key, ttl).await?;
            Ok(lease.map(|lease| lease.rebind(self.leases.get_or_init(|| Arc::new(self.clone())))))
        }
        async fn unlock(&self, key: &str, owner: &str) -> crate::Result<()> {
            self.inner.unlock(key, owner).await
        }
        async fn refresh(&self, key: &str, owner: &str, ttl: Duration) -> crate::Result<()> {
            self.inner.refresh(key, owner, ttl).await
        }
        async fn refresh_many(&self, requests: &[RefreshRequest<'_>]) -> Vec<crate::Result<()>> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            self.refreshed.fetch_add(requests.len(), Ordering::SeqCst);
            self.inner.refresh_many(requests).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_refreshes_of_many_leases_go_out_in_few_batches() {
        let locker = Batching::default();
        let mut leases = Vec::new();
        for i in 0..200 {
            let mut lease = locker
                .try_lock(&format!("k{i}"), TTL)
                .await
                .unwrap()
                .unwrap();
            lease.keep_alive(KeepAlive::default()).unwrap();
            leases.push(lease);
        }
        // Refreshes due at 1 s, 2 s and 3 s after the grants.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(locker.refreshed.load(Ordering::SeqCst), 600);
        assert_eq!(
            locker.batches.load(Ordering::SeqCst),
            3,
            "one batch per round, not one refresh per lease"
        );
        assert!(leases.iter().all(|lease| !lease.is_lost()));
        for lease in leases {
            lease.release().await.unwrap();
        }
        let refreshed = locker.refreshed.load(Ordering::SeqCst);
        tokio::time::sleep(TTL * 2).await;
        assert_eq!(
            locker.refreshed.load(Ordering::SeqCst),
            refreshed,
            "no refresh after release"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        /// Any interval and max hold, the largest included: the keepalive
        /// task renews or stops, it never panics (a panic would silently end
        /// renewal).
        #[test]
        fn extreme_keepalive_settings_never_panic(
            interval in crate::test_support::any_duration(),
            max_hold in crate::test_support::any_duration(),
        ) {
            let runtime = crate::test_support::paused_runtime();
            runtime.block_on(async {
                let flaky = Flaky::default();
                let mut lease = flaky.try_lock("k", TTL).await.unwrap().unwrap();
                lease
                    .keep_alive(KeepAlive::default().interval(interval).max_hold(max_hold))
                    .unwrap();
                tokio::time::sleep(TTL * 3).await;
                let task = lease.take_keepalive_for_test().expect("started");
                if task.is_finished() {
                    task.await.expect("the keepalive task ended without panicking");
                }
            });
        }
    }
}
