//! The timed workloads (the election ones are in `election.rs`). Each
//! returns what it measured and the keys it used, which the caller forgets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::semaphore::Semaphore;
use distlock::{Error, KeepAlive, Lease, Locker};

use super::counting::CountingLocker;
use super::report::{Common, ContendedRun, HoldRun, PermitPath, PermitsRun, Run, UncontendedRun};
use super::stats::Latencies;
use super::{probe, Plan, MAX_DURATION};

/// A pause after an error, so a dead server is not hammered in a hot loop.
const ERROR_PAUSE: Duration = Duration::from_millis(10);
/// How long a contended holder holds the key: far longer than a loopback
/// round trip, so the other clients are waiting when it is released.
const CONTENDED_HOLD: Duration = Duration::from_millis(1);
/// How often the hold workload updates its progress count while it holds.
const PROGRESS_STEP: Duration = Duration::from_millis(250);
/// How long a permits client waits after finding every permit held.
const FULL_PAUSE: Duration = Duration::from_millis(1);
/// The permits workload takes turns between its slices (see [`Slice`]) of
/// at most this long (a tenth of the run for a short one), so all see the
/// same load.
const MAX_SLICE: Duration = Duration::from_millis(250);

/// What one client task counted.
struct Tally {
    acquire: Latencies,
    release: Latencies,
    gaps: Latencies,
    /// Permit attempts that found every permit held.
    full: Latencies,
    /// Calls to the locker (see `counting::Counts::attempt_calls`) made by
    /// the permit attempts that were granted, by those that found every
    /// permit held, and the most made by one attempt.
    granted_calls: u64,
    full_calls: u64,
    most_calls: u64,
    done: u64,
    contended: u64,
    timeouts: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            acquire: Latencies::new(),
            release: Latencies::new(),
            gaps: Latencies::new(),
            full: Latencies::new(),
            granted_calls: 0,
            full_calls: 0,
            most_calls: 0,
            done: 0,
            contended: 0,
            timeouts: 0,
            errors: 0,
            first_error: None,
        }
    }

    fn error(&mut self, error: &Error) {
        self.errors += 1;
        self.first_error.get_or_insert_with(|| error.to_string());
    }

    fn merge(&mut self, other: Tally) {
        self.acquire.merge(&other.acquire);
        self.release.merge(&other.release);
        self.gaps.merge(&other.gaps);
        self.full.merge(&other.full);
        self.granted_calls += other.granted_calls;
        self.full_calls += other.full_calls;
        self.most_calls = self.most_calls.max(other.most_calls);
        self.done += other.done;
        self.contended += other.contended;
        self.timeouts += other.timeouts;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn common(&self, locker: &dyn Locker, plan: &Plan, elapsed: Duration) -> Common {
        Common {
            backend: locker.backend(),
            clients: plan.clients,
            duration_s: elapsed.as_secs_f64(),
            ttl_s: plan.ttl.as_secs_f64(),
            errors: self.errors,
            first_error: self.first_error.clone(),
        }
    }
}

/// The run's end; `bench` checked the duration against [`MAX_DURATION`].
fn deadline(plan: &Plan) -> Instant {
    let now = Instant::now();
    now.checked_add(plan.duration.min(MAX_DURATION))
        .unwrap_or(now)
}

/// Runs `work(client)` on `plan.clients` tasks and merges their tallies.
async fn on_clients<F, Fut>(plan: &Plan, work: F) -> Tally
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Tally> + Send + 'static,
{
    let handles: Vec<_> = (0..plan.clients).map(|c| tokio::spawn(work(c))).collect();
    let mut total = Tally::new();
    for handle in handles {
        match handle.await {
            Ok(tally) => total.merge(tally),
            Err(panic) => {
                total.errors += 1;
                total
                    .first_error
                    .get_or_insert_with(|| format!("benchmark task failed: {panic}"));
            }
        }
    }
    total
}

/// Each client acquires and releases a key of its own, as fast as it can:
/// `try_lock` + `release`, timed apart.
pub(crate) async fn uncontended(locker: &Arc<dyn Locker>, plan: &Plan) -> (Run, Vec<String>) {
    let keys: Vec<String> = (0..plan.clients)
        .map(|c| format!("{}-{c}", plan.prefix))
        .collect();
    let started = Instant::now();
    let deadline = deadline(plan);
    let tally = on_clients(plan, |client| {
        let locker = locker.clone();
        let key = keys.get(client).cloned().unwrap_or_default();
        let (ttl, progress) = (plan.ttl, plan.progress.clone());
        async move {
            let mut tally = Tally::new();
            while Instant::now() < deadline {
                let done = tally.done;
                if !lock_cycle(&*locker, &key, ttl, &mut tally).await {
                    break;
                }
                progress.fetch_add(tally.done - done, Ordering::Relaxed);
            }
            tally
        }
    })
    .await;
    let elapsed = started.elapsed();
    let run = Run::Uncontended(UncontendedRun {
        common: tally.common(&**locker, plan, elapsed),
        cycles: tally.done,
        cycles_per_s: per_second(tally.done, elapsed),
        acquire_us: tally.acquire.summary(),
        release_us: tally.release.summary(),
        contended: tally.contended,
    });
    (run, keys)
}

/// Times one `try_lock` + `release` of a key nobody else uses into
/// `tally` (see [`uncontended`]); false after an error that will not pass.
async fn lock_cycle(locker: &dyn Locker, key: &str, ttl: Duration, tally: &mut Tally) -> bool {
    // Held: a stale lock from an earlier failure, or a backend bug: counted.
    timed_cycle(locker.try_lock(key, ttl), tally, None).await
}

/// Times one `try_acquire` of a permit + its `release` into `tally`; an
/// attempt that finds every permit held is timed apart and followed by
/// [`FULL_PAUSE`]. `calls` counts the calls the semaphore's locker makes
/// (this client's own counter): the attempt's share is added to `tally`.
/// False after an error that will not pass.
async fn permit_cycle(
    semaphore: &Semaphore,
    calls: &AtomicU64,
    ttl: Duration,
    tally: &mut Tally,
) -> bool {
    let (before, granted, full) = (
        calls.load(Ordering::Relaxed),
        tally.acquire.len(),
        tally.contended,
    );
    let going = timed_cycle(semaphore.try_acquire(ttl), tally, Some(FULL_PAUSE)).await;
    let made = calls.load(Ordering::Relaxed).saturating_sub(before);
    if tally.acquire.len() > granted {
        tally.granted_calls += made;
    } else if tally.contended > full {
        tally.full_calls += made;
    }
    tally.most_calls = tally.most_calls.max(made);
    going
}

/// Times `attempt` and the release of what it granted into `tally`. An
/// attempt that found the key held is counted (and timed apart into
/// `tally.full`), then followed by `held_pause`, or a yield without one.
/// False after an error that will not pass.
async fn timed_cycle(
    attempt: impl std::future::Future<Output = distlock::Result<Option<Lease>>>,
    tally: &mut Tally,
    held_pause: Option<Duration>,
) -> bool {
    let before = Instant::now();
    match attempt.await {
        Ok(Some(lease)) => {
            let acquired = Instant::now();
            tally.acquire.record(acquired.duration_since(before));
            match lease.release().await {
                Ok(()) => {
                    tally.release.record(acquired.elapsed());
                    tally.done += 1;
                }
                Err(error) => tally.error(&error),
            }
        }
        Ok(None) => {
            tally.full.record(before.elapsed());
            tally.contended += 1;
            match held_pause {
                Some(pause) => tokio::time::sleep(pause).await,
                None => tokio::task::yield_now().await,
            }
        }
        Err(error) => {
            tally.error(&error);
            if matches!(error, Error::InvalidInput { .. }) {
                return false;
            }
            tokio::time::sleep(ERROR_PAUSE).await;
        }
    }
    true
}

/// What the permits workload measures, in turns of one slice each, in
/// this order, so each sees the same seconds of load as the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slice {
    /// A permit through the locker's own `try_lock_any` (one request on a
    /// backend with a native attempt).
    Native,
    /// A permit through the trait's default `try_lock_any`: one `try_lock`
    /// per key tried ([`CountingLocker::in_turn`]).
    Generic,
    /// The lock's own cycle, `try_lock` + `release` of a key per client.
    Lock,
}

const SLICES: [Slice; 3] = [Slice::Native, Slice::Generic, Slice::Lock];

/// The slice `since_start` falls in, slices of `slice` taking turns from
/// the run's start.
fn slice_at(since_start: Duration, slice: Duration) -> Slice {
    let index = since_start.as_nanos() / slice.as_nanos().max(1);
    SLICES[(index % SLICES.len() as u128) as usize]
}

/// Of `elapsed` cut into slices taking turns, the time each kind had, in
/// the order of [`SLICES`].
fn slice_times(elapsed: Duration, slice: Duration) -> [Duration; 3] {
    let slice_ns = slice.as_nanos().max(1);
    let total = elapsed.as_nanos();
    let (whole, rest) = (total / slice_ns, total % slice_ns);
    let kinds = SLICES.len() as u128;
    let nanos = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
    std::array::from_fn(|kind| {
        let kind = kind as u128;
        // Whole slices: one per full turn, one more if the last turn got
        // this far; the unfinished slice belongs to the kind after them.
        let slices = whole / kinds + u128::from(kind < whole % kinds);
        let partial = if kind == whole % kinds { rest } else { 0 };
        nanos(slices * slice_ns + partial)
    })
}

/// Every client takes a permit of one semaphore of `plan.permits` permits
/// through `try_acquire` and releases it at once, retrying after
/// [`FULL_PAUSE`] when all are held; in turns of one slice each
/// ([`Slice`]), its attempt is the locker's own `try_lock_any` (native),
/// the trait's default one key at a time (generic), or, instead of a
/// permit, a lock of its own (`try_lock` + `release`, as [`uncontended`]).
/// So the two permit paths and the lock are measured under the same load
/// on the same server. Each client's semaphores sit on counting lockers of
/// its own, so each attempt's calls to the locker are counted exactly.
pub(crate) async fn permits(locker: &Arc<dyn Locker>, plan: &Plan) -> (Run, Vec<String>) {
    let name = format!("{}-permits", plan.prefix);
    let semaphore = |counting: &Arc<CountingLocker>| {
        Semaphore::new(
            counting.clone() as Arc<dyn Locker>,
            name.clone(),
            plan.permits,
        )
    };
    // Checks the name and N once, before any client starts.
    let probe = match semaphore(&Arc::new(CountingLocker::new(locker.clone()))) {
        Ok(semaphore) => semaphore,
        Err(error) => {
            let mut tally = Tally::new();
            tally.error(&error);
            let none = Tally::new();
            let run = permits_run(
                locker,
                plan,
                [&tally, &none, &none],
                Duration::ZERO,
                MAX_SLICE,
            );
            return (run, Vec::new());
        }
    };
    let lock_keys: Vec<String> = (0..plan.clients)
        .map(|c| format!("{}-lock-{c}", plan.prefix))
        .collect();
    let slice = (plan.duration / 10).clamp(Duration::from_millis(1), MAX_SLICE);
    let started = Instant::now();
    let deadline = deadline(plan);
    // The generic and lock tallies; the native one is what `on_clients` merges.
    let others = Arc::new(Mutex::new((Tally::new(), Tally::new())));
    let native_tally = on_clients(plan, |client| {
        let (locker, others) = (locker.clone(), others.clone());
        let native = Arc::new(CountingLocker::new(locker.clone()));
        let generic = Arc::new(CountingLocker::in_turn(locker.clone()));
        let semaphores = semaphore(&native).and_then(|n| semaphore(&generic).map(|g| (n, g)));
        let key = lock_keys.get(client).cloned().unwrap_or_default();
        let (ttl, progress) = (plan.ttl, plan.progress.clone());
        async move {
            let (mut tallies, mut lock) = ([Tally::new(), Tally::new()], Tally::new());
            let (native_semaphore, generic_semaphore) = match semaphores {
                Ok(semaphores) => semaphores,
                Err(error) => {
                    let [mut native, _] = tallies;
                    native.error(&error);
                    return native;
                }
            };
            let done = |t: &[Tally; 2], lock: &Tally| t[0].done + t[1].done + lock.done;
            loop {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                let before = done(&tallies, &lock);
                let going = match slice_at(now.duration_since(started), slice) {
                    Slice::Native => {
                        let calls = &native.counts().attempt_calls;
                        permit_cycle(&native_semaphore, calls, ttl, &mut tallies[0]).await
                    }
                    Slice::Generic => {
                        let calls = &generic.counts().attempt_calls;
                        permit_cycle(&generic_semaphore, calls, ttl, &mut tallies[1]).await
                    }
                    Slice::Lock => lock_cycle(&*locker, &key, ttl, &mut lock).await,
                };
                if !going {
                    break;
                }
                progress.fetch_add(done(&tallies, &lock) - before, Ordering::Relaxed);
            }
            let [native, generic] = tallies;
            let mut others = others
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            others.0.merge(generic);
            others.1.merge(lock);
            native
        }
    })
    .await;
    let elapsed = started.elapsed();
    let (generic_tally, lock_tally) = std::mem::replace(
        &mut *others
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
        (Tally::new(), Tally::new()),
    );
    let run = permits_run(
        locker,
        plan,
        [&native_tally, &generic_tally, &lock_tally],
        elapsed,
        slice,
    );
    // Permit N is only inspected, never locked; forgotten all the same.
    let mut keys: Vec<String> = (0..=plan.permits)
        .map(|index| probe.permit_key(index))
        .collect();
    keys.extend(lock_keys);
    (run, keys)
}

/// The permits run from the tallies of its slices (in the order of
/// [`SLICES`]), `elapsed` cut in slices of `slice`.
fn permits_run(
    locker: &Arc<dyn Locker>,
    plan: &Plan,
    [native, generic, lock]: [&Tally; 3],
    elapsed: Duration,
    slice: Duration,
) -> Run {
    let mut common = native.common(&**locker, plan, elapsed);
    for other in [generic, lock] {
        common.errors += other.errors;
        if common.first_error.is_none() {
            common.first_error.clone_from(&other.first_error);
        }
    }
    let [native_time, generic_time, lock_time] = slice_times(elapsed, slice);
    let lock_cycles_per_s = per_second(lock.done, lock_time);
    Run::Permits(PermitsRun {
        common,
        permits: plan.permits,
        slice_s: slice.as_secs_f64(),
        native: permit_path(native, native_time, lock_cycles_per_s),
        generic: Box::new(permit_path(generic, generic_time, lock_cycles_per_s)),
        lock_cycles: lock.done,
        lock_cycles_per_s,
        lock_acquire_us: lock.acquire.summary(),
        lock_release_us: lock.release.summary(),
        lock_contended: lock.contended,
    })
}

/// One permit path's figures from its tally and the time its slices had.
fn permit_path(tally: &Tally, time: Duration, lock_cycles_per_s: f64) -> PermitPath {
    let cycles_per_s = per_second(tally.done, time);
    let granted = tally.acquire.len();
    let attempts = granted + tally.contended;
    let mean = |calls: u64, of: u64| (of > 0).then(|| calls as f64 / of as f64);
    PermitPath {
        cycles: tally.done,
        cycles_per_s,
        acquire_us: tally.acquire.summary(),
        release_us: tally.release.summary(),
        attempts,
        full: tally.contended,
        full_fraction: mean(tally.contended, attempts).unwrap_or(0.0),
        full_attempt_us: tally.full.summary(),
        calls_per_acquire: mean(tally.granted_calls, granted),
        calls_per_full: mean(tally.full_calls, tally.contended),
        most_calls: tally.most_calls,
        permit_per_lock: (lock_cycles_per_s > 0.0).then(|| cycles_per_s / lock_cycles_per_s),
    }
}

/// Pairs each grant with the release before it: the gap runs from the
/// previous holder's `release` being *sent* to this holder's `lock`
/// returning. The next grant cannot return before the release is sent, so
/// no gap is negative, and none is clamped to 0 (from the release
/// *returning*, a server that answers the waiter before the releaser, as
/// MariaDB's `RELEASE_LOCK` does, would give a negative gap).
#[derive(Default)]
struct Handoffs {
    /// A grant has happened, so the next one is a handoff.
    held_before: bool,
    /// When the last release was sent, not yet paired with the next grant.
    release_sent_at: Option<Instant>,
}

impl Handoffs {
    /// A holder is about to send its release.
    fn sending_release(&mut self, at: Instant) {
        self.release_sent_at = Some(at);
    }

    /// A grant returned at `at`: the gap from the release it follows.
    fn granted(&mut self, at: Instant) -> Option<Duration> {
        if !std::mem::replace(&mut self.held_before, true) {
            return None;
        }
        self.release_sent_at
            .take()
            .map(|sent| at.saturating_duration_since(sent))
    }

    /// A release failed: the next grant follows an expiry, not a handoff.
    fn reset(&mut self) {
        *self = Handoffs::default();
    }
}

/// Every client waits for one key through `lock(timeout)`, holds it for
/// [`CONTENDED_HOLD`], releases it, and waits for another client's grant
/// before trying again: handoffs per second, and the gap between one
/// holder's release and the next holder's grant, which is what the wait
/// mechanism (notification, the server's queue, or polling) costs.
pub(crate) async fn contended(locker: &Arc<dyn Locker>, plan: &Plan) -> (Run, Vec<String>) {
    let key = format!("{}-shared", plan.prefix);
    let handoffs = Arc::new(Mutex::new(Handoffs::default()));
    // The number of grants so far, watched by each releaser to rejoin.
    let grants = Arc::new(tokio::sync::watch::Sender::new(0u64));
    let started = Instant::now();
    let deadline = deadline(plan);
    let rejoin_after_others = plan.clients > 1;
    let tally = on_clients(plan, |_| {
        let (locker, key, handoffs) = (locker.clone(), key.clone(), handoffs.clone());
        let (ttl, progress, grants) = (plan.ttl, plan.progress.clone(), grants.clone());
        async move {
            let mut tally = Tally::new();
            let mut others = grants.subscribe();
            loop {
                let before = Instant::now();
                let Some(timeout) = deadline
                    .checked_duration_since(before)
                    .filter(|t| !t.is_zero())
                else {
                    break;
                };
                let lease = match locker.lock(&key, ttl, timeout).await {
                    Ok(lease) => lease,
                    Err(Error::Timeout { .. } | Error::NotAcquired { .. }) => {
                        tally.timeouts += 1;
                        continue;
                    }
                    Err(error) => {
                        tally.error(&error);
                        if matches!(error, Error::InvalidInput { .. }) {
                            break;
                        }
                        tokio::time::sleep(ERROR_PAUSE).await;
                        continue;
                    }
                };
                let granted = Instant::now();
                let in_time = granted < deadline;
                if in_time {
                    tally.acquire.record(granted.duration_since(before));
                    if let Some(gap) = lock_handoffs(&handoffs).granted(granted) {
                        tally.gaps.record(gap);
                    }
                }
                let mut mine = 0;
                grants.send_modify(|count| {
                    *count += 1;
                    mine = *count;
                });
                // Hold it long enough for the previous holder, woken by this
                // grant, to be waiting again when it is released.
                tokio::time::sleep(CONTENDED_HOLD).await;
                let releasing = Instant::now();
                // Before the release is sent: the next grant, which may
                // return before this release does, pairs with it.
                lock_handoffs(&handoffs).sending_release(releasing);
                let outcome = lease.release().await;
                let released = Instant::now();
                match outcome {
                    Ok(()) if in_time => {
                        tally.release.record(released.duration_since(releasing));
                        tally.done += 1;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(()) => break,
                    Err(error) => {
                        tally.error(&error);
                        lock_handoffs(&handoffs).reset();
                    }
                }
                if rejoin_after_others {
                    // Try again only once another client has it: a releaser
                    // that re-takes the lock at once would measure itself,
                    // not the handoff to a waiter.
                    let until = tokio::time::Instant::from_std(deadline);
                    let _ = tokio::time::timeout_at(until, others.wait_for(|&n| n > mine)).await;
                }
            }
            tally
        }
    })
    .await;
    let elapsed = started.elapsed();
    let run = Run::Contended(ContendedRun {
        common: tally.common(&**locker, plan, elapsed),
        handoffs: tally.done,
        handoffs_per_s: per_second(tally.done, elapsed),
        handoff_gap_us: tally.gaps.summary(),
        wait_us: tally.acquire.summary(),
        release_us: tally.release.summary(),
        timeouts: tally.timeouts,
    });
    (run, vec![key])
}

/// The pairing state survives a panicking holder (it holds no invariant a
/// half-done update could break).
fn lock_handoffs(handoffs: &Mutex<Handoffs>) -> std::sync::MutexGuard<'_, Handoffs> {
    handoffs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Acquires `plan.keys` leases (spread over the clients), measures this
/// process's memory, starts a keepalive on each, holds them for the
/// duration counting the refreshes, measures again, then releases them all.
pub(crate) async fn hold(locker: &Arc<dyn Locker>, plan: &Plan) -> (Run, Vec<String>) {
    let counting = CountingLocker::new(locker.clone());
    let counted: Arc<dyn Locker> = Arc::new(counting.clone());
    let keys: Arc<Vec<String>> = Arc::new(
        (0..plan.keys)
            .map(|k| format!("{}-hold-{k}", plan.prefix))
            .collect(),
    );
    let memory_before = probe::memory();
    let connections_before = probe::tcp_connections();
    let descriptors_before = probe::open_descriptors();

    // Acquire: client c takes keys c, c + clients, c + 2 clients...
    let acquiring = Instant::now();
    let held: Arc<Mutex<Vec<Lease>>> = Arc::new(Mutex::new(Vec::with_capacity(plan.keys)));
    let mut tally = on_clients(plan, |client| {
        let (locker, keys, held) = (counted.clone(), keys.clone(), held.clone());
        let (ttl, clients, acquired) = (plan.ttl, plan.clients, plan.acquired.clone());
        async move {
            let mut tally = Tally::new();
            // Sized once: a growing vector would leave freed buffers of
            // leases behind, counted as the leases' memory.
            let mut mine = Vec::with_capacity(keys.len() / clients + 1);
            for key in keys.iter().skip(client).step_by(clients) {
                let before = Instant::now();
                match locker.try_lock(key, ttl).await {
                    Ok(Some(lease)) => {
                        tally.acquire.record(before.elapsed());
                        mine.push(lease);
                    }
                    Ok(None) => tally.contended += 1,
                    Err(error) => tally.error(&error),
                }
                // Attempts, not grants: the line reaches its total whatever
                // the answers.
                acquired.fetch_add(1, Ordering::Relaxed);
            }
            held.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend(mine);
            tally
        }
    })
    .await;
    let acquire_s = acquiring.elapsed().as_secs_f64();
    let mut leases = std::mem::take(&mut *held.lock().unwrap_or_else(|p| p.into_inner()));
    let memory_held = probe::memory();

    let mut keepalive_errors = 0u64;
    for lease in &mut leases {
        if let Err(error) = lease.keep_alive(KeepAlive::default()) {
            keepalive_errors += 1;
            tally.error(&error);
        }
    }

    let refreshes_before = counting.counts().calls.load(Ordering::Relaxed);
    let batches_before = counting.counts().batches.load(Ordering::Relaxed);
    let failures_before = counting.counts().failures.load(Ordering::Relaxed);
    let holding = Instant::now();
    let until = deadline(plan);
    loop {
        let now = Instant::now();
        let Some(left) = until.checked_duration_since(now).filter(|t| !t.is_zero()) else {
            break;
        };
        tokio::time::sleep(left.min(PROGRESS_STEP)).await;
        let so_far = counting.counts().calls.load(Ordering::Relaxed);
        plan.progress
            .store(so_far.saturating_sub(refreshes_before), Ordering::Relaxed);
    }
    let held_for = holding.elapsed();
    // At the end of the hold, after the keepalives' first rounds: what
    // holding costs once they run (their scheduler's state, and whatever
    // batch is on its way), not the registrations still queued for it.
    let memory_kept = probe::memory();
    let refreshes = counting
        .counts()
        .calls
        .load(Ordering::Relaxed)
        .saturating_sub(refreshes_before);
    let refresh_failures = counting
        .counts()
        .failures
        .load(Ordering::Relaxed)
        .saturating_sub(failures_before);
    let refresh_batches = counting
        .counts()
        .batches
        .load(Ordering::Relaxed)
        .saturating_sub(batches_before);
    let connections = probe::tcp_connections();
    let descriptors = probe::open_descriptors();
    let lost = leases.iter().filter(|lease| lease.is_lost()).count();

    // Release, spread over the clients again.
    let releasing = Instant::now();
    let shares = split(leases, plan.clients);
    let shares = Arc::new(Mutex::new(shares));
    let released = on_clients(plan, |_| {
        let shares = shares.clone();
        async move {
            let mut tally = Tally::new();
            let mine = shares
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop()
                .unwrap_or_default();
            for lease in mine {
                let before = Instant::now();
                match lease.release().await {
                    Ok(()) => tally.release.record(before.elapsed()),
                    Err(error) => tally.error(&error),
                }
            }
            tally
        }
    })
    .await;
    let release_s = releasing.elapsed().as_secs_f64();
    tally.merge(released);

    let held_count = tally.acquire.len();
    let per_lease = |after: Option<u64>, before: Option<u64>| {
        let grown = after?.checked_sub(before?)?;
        (held_count > 0).then(|| grown as f64 / held_count as f64)
    };
    let run = Run::Hold(HoldRun {
        common: tally.common(&**locker, plan, held_for),
        leases: held_count,
        not_acquired: tally.contended,
        acquire_s,
        acquire_us: tally.acquire.summary(),
        bytes_per_lease: per_lease(memory_held.resident, memory_before.resident),
        bytes_per_lease_with_keepalive: per_lease(memory_kept.resident, memory_before.resident),
        heap_bytes_per_lease: per_lease(memory_held.heap, memory_before.heap),
        heap_bytes_per_lease_with_keepalive: per_lease(memory_kept.heap, memory_before.heap),
        tcp_connections: connections,
        tcp_connections_before: connections_before,
        open_descriptors: descriptors,
        open_descriptors_before: descriptors_before,
        refreshes,
        refreshes_per_s: per_second(refreshes, held_for),
        refresh_batches,
        refresh_batches_per_s: per_second(refresh_batches, held_for),
        refresh_failures,
        keepalive_errors,
        lost: lost as u64,
        release_s,
        release_us: tally.release.summary(),
    });
    (run, keys.to_vec())
}

/// `items` dealt into `parts` piles.
fn split<T>(items: Vec<T>, parts: usize) -> Vec<Vec<T>> {
    let mut piles: Vec<Vec<T>> = (0..parts.max(1)).map(|_| Vec::new()).collect();
    let count = piles.len();
    for (index, item) in items.into_iter().enumerate() {
        if let Some(pile) = piles.get_mut(index % count) {
            pile.push(item);
        }
    }
    piles
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handoff_is_timed_from_the_release_being_sent() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut handoffs = Handoffs::default();
        // The first grant follows no release.
        assert_eq!(handoffs.granted(at(0)), None);
        handoffs.sending_release(at(1));
        assert_eq!(handoffs.granted(at(4)), Some(Duration::from_millis(3)));
        // A grant that returns before the release it follows returned is
        // still timed from the release being sent, never 0.
        handoffs.sending_release(at(5));
        assert_eq!(handoffs.granted(at(6)), Some(Duration::from_millis(1)));
        // Each release pairs with one grant.
        assert_eq!(handoffs.granted(at(9)), None);
        // After a failed release, pairing starts over.
        handoffs.sending_release(at(10));
        handoffs.reset();
        assert_eq!(handoffs.granted(at(20)), None);
    }

    #[test]
    fn permit_and_lock_slices_take_turns_and_share_the_run() {
        let ms = Duration::from_millis;
        assert_eq!(slice_at(ms(0), ms(10)), Slice::Native);
        assert_eq!(slice_at(ms(9), ms(10)), Slice::Native);
        assert_eq!(slice_at(ms(10), ms(10)), Slice::Generic);
        assert_eq!(slice_at(ms(25), ms(10)), Slice::Lock);
        assert_eq!(slice_at(ms(30), ms(10)), Slice::Native);
        // 4 whole slices (native, generic, lock, native) and 5 ms of a
        // generic one.
        assert_eq!(slice_times(ms(45), ms(10)), [ms(20), ms(15), ms(10)]);
        assert_eq!(slice_times(ms(35), ms(10)), [ms(15), ms(10), ms(10)]);
        assert_eq!(slice_times(ms(30), ms(10)), [ms(10), ms(10), ms(10)]);
        assert_eq!(slice_times(ms(5), ms(10)), [ms(5), ms(0), ms(0)]);
    }

    #[test]
    fn leases_are_dealt_evenly() {
        let piles = split((0..7).collect(), 3);
        assert_eq!(piles, vec![vec![0, 3, 6], vec![1, 4], vec![2, 5]]);
        assert_eq!(split(vec![1], 0), vec![vec![1]]);
    }
}
