//! The scheduler task behind every keepalive of one locker: a timer queue of
//! the leases it renews, and the refreshes that fall due together sent as
//! one [`Locker::refresh_many`] batch (see the [parent module](super)).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::signal::{extend_validity, mark_lost, mark_lost_with_grace, LostReason};
use super::{interval_for, Entry};
use crate::deadline::{checked_deadline, sleep_until};
use crate::util;
use crate::{Error, Locker, RefreshRequest};

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

/// What a lease's [`Registration`](super::Registration) tells its scheduler.
pub(super) enum Command {
    Add(u64, Entry),
    Remove(u64),
}

/// The handle of one locker's scheduler task; the task ends once every
/// registration (and so every handle) is gone.
pub(super) struct Scheduler {
    pub(super) commands: mpsc::UnboundedSender<Command>,
    pub(super) next_id: AtomicU64,
    #[cfg(test)]
    pub(super) task: Mutex<Option<tokio::task::JoinHandle<()>>>,
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
    /// The scheduler renewing `locker`'s leases on `runtime`, started there
    /// if none runs.
    pub(super) fn of(locker: &Arc<dyn Locker>, runtime: &tokio::runtime::Handle) -> Arc<Scheduler> {
        let address = (Arc::as_ptr(locker).cast::<()>() as usize, runtime.id());
        let mut schedulers = util::lock(&SCHEDULERS);
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
            return self.end(id, LostReason::MaxHoldExceeded);
        }
        if status.valid_until.is_some_and(|until| now >= until) {
            return self.end(id, LostReason::Expired);
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

    /// Ends lease `id`'s renewal because of `reason` (its max hold or its
    /// validity passed), saying so in the log and on its lost signal.
    fn end(&mut self, id: u64, reason: LostReason) -> Next {
        if let Some(scheduled) = self.entries.remove(&id) {
            let key = &*scheduled.entry.key;
            match reason {
                LostReason::MaxHoldExceeded => tracing::warn!(
                    component = "distlock",
                    key,
                    "lease reached its max hold; renewal stops and the holder must stop its work and release"
                ),
                _ => tracing::warn!(
                    component = "distlock",
                    key,
                    "lease expired before a refresh succeeded"
                ),
            }
            mark_lost(&scheduled.entry.status, reason);
        }
        Next::Never
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
