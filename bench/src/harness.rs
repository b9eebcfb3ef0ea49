//! Rounds of interleaved measurements: every contender of a group runs once
//! per round, in an order rotated each round, on the same servers; a round
//! during which other processes used the CPU is kept in the results but
//! marked dropped, and left out of medians and ratios.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::cpu::{Sample, Usage};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One acquire + release of client `c`'s own key.
pub type Cycle = Arc<dyn Fn(usize) -> BoxFuture<Result<(), String>> + Send + Sync>;

/// Client `c` waits for the shared key; the lock is held until the returned
/// release runs.
pub type Handoff = Arc<dyn Fn(usize) -> BoxFuture<Result<Release, String>> + Send + Sync>;

/// Releases a lock a [`Handoff`] took.
pub type Release = Box<dyn FnOnce() -> BoxFuture<Result<(), String>> + Send>;

/// Boxes an async release as a [`Release`].
pub fn release<F, Fut>(f: F) -> Release
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    Box::new(move || Box::pin(f()))
}

/// What a contender is, for the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The raw client doing the round trips, without a library.
    Floor,
    Distlock,
    Peer,
    /// distlock with one option changed, to measure what the option costs
    /// (distlock's ratio to it is that cost).
    Variant,
}

pub enum Job {
    Cycle(Cycle),
    Handoff(Handoff),
}

pub struct Contender {
    pub name: String,
    pub role: Role,
    /// What one cycle sends, in a few words.
    pub does: String,
    /// Whether it bumps a fencing counter under the lock, where the
    /// backend has fencing: a floor is paired only with the distlock that
    /// does the same work (`None`: paired with every distlock).
    pub fencing: Option<bool>,
    pub job: Job,
}

impl Contender {
    pub fn cycle(name: &str, role: Role, does: &str, cycle: Cycle) -> Self {
        Contender {
            name: name.into(),
            role,
            does: does.into(),
            fencing: None,
            job: Job::Cycle(cycle),
        }
    }

    pub fn handoff(name: &str, role: Role, does: &str, handoff: Handoff) -> Self {
        Contender {
            name: name.into(),
            role,
            does: does.into(),
            fencing: None,
            job: Job::Handoff(handoff),
        }
    }

    /// Marks whether this contender bumps a fencing counter (see
    /// [`Contender::fencing`]).
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = Some(on);
        self
    }
}

/// Boxes an async closure as a [`Cycle`].
pub fn cycle<F, Fut>(f: F) -> Cycle
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    Arc::new(move |client| Box::pin(f(client)))
}

/// Boxes an async closure as a [`Handoff`].
pub fn handoff<F, Fut>(f: F) -> Handoff
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Release, String>> + Send + 'static,
{
    Arc::new(move |client| Box::pin(f(client)))
}

/// How long each measurement lasts, how many rounds, and how much foreign
/// CPU use drops a round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub rounds: usize,
    pub warmup_s: f64,
    pub measure_s: f64,
    /// A round is dropped if other processes used more than this many cores
    /// during any of its measurements.
    pub max_other_cores: f64,
}

/// One workload at one client count on one backend, and its contenders.
pub struct Group {
    pub backend: &'static str,
    pub workload: Workload,
    pub clients: usize,
    pub contenders: Vec<Contender>,
    /// The server processes (their children are counted too).
    pub server_pids: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Acquire + release cycles per second, each client on its own key.
    Uncontended,
    /// Handoffs of one key among all clients; the gap distribution.
    Contended,
}

/// Latency quantiles, in microseconds: for cycles the acquire + release
/// time, for handoffs the gap from a release being sent to the next grant
/// returning.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// (quantile, µs) at 1 % steps and the tail, for the distribution plots.
    pub curve: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    pub contender: String,
    /// Cycles or handoffs.
    pub ops: u64,
    pub ops_per_s: f64,
    pub latency: Quantiles,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    pub cpu: Usage,
    /// Contended only: grants that went to a client which was not yet
    /// waiting when the previous holder was granted (a fresh attempt
    /// overtaking the waiters); their gaps are not in `latency`.
    #[serde(default)]
    pub barged: u64,
    /// Contended only: handoffs whose grant returned before the previous
    /// holder's release returned (the server answered the waiter first).
    /// Their gaps count from the release being sent, like every gap.
    #[serde(default)]
    pub granted_before_release_returned: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Round {
    pub index: usize,
    /// The order the contenders ran in.
    pub order: Vec<String>,
    pub measurements: Vec<Measurement>,
    /// The most any measurement of the round saw other processes use.
    pub max_other_cores: f64,
    pub kept: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContenderInfo {
    pub name: String,
    pub role: Role,
    pub does: String,
    /// See [`Contender::fencing`]; absent in results written before it.
    #[serde(default)]
    pub fencing: Option<bool>,
}

/// Everything measured for one group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupResult {
    pub backend: String,
    pub workload: Workload,
    pub clients: usize,
    pub contenders: Vec<ContenderInfo>,
    pub rounds: Vec<Round>,
}

/// Runs every round of `group`.
pub async fn run_group(group: &Group, settings: &Settings) -> GroupResult {
    let count = group.contenders.len();
    let mut rounds = Vec::with_capacity(settings.rounds);
    for index in 0..settings.rounds {
        // Rotate the order so no contender always runs first (on a cold
        // cache) or right after the same neighbour.
        let order: Vec<usize> = (0..count).map(|i| (i + index) % count).collect();
        let mut measurements = Vec::with_capacity(count);
        for &i in &order {
            let contender = &group.contenders[i];
            let measurement = measure(contender, group, settings).await;
            eprintln!(
                "  {} {:?} {} clients, round {}: {:<34} {:>9.0}/s p50 {:>8.1}µs p99 {:>8.1}µs \
                 (client {:.2}, server {:.2}, other {:.2} cores){}",
                group.backend,
                group.workload,
                group.clients,
                index + 1,
                contender.name,
                measurement.ops_per_s,
                measurement.latency.p50_us,
                measurement.latency.p99_us,
                measurement.cpu.client_cores,
                measurement.cpu.server_cores,
                measurement.cpu.other_cores,
                measurement
                    .first_error
                    .as_deref()
                    .map(|e| format!(" ERRORS {}: {e}", measurement.errors))
                    .unwrap_or_default(),
            );
            measurements.push(measurement);
        }
        let max_other = measurements
            .iter()
            .map(|m| m.cpu.other_cores)
            .fold(0.0, f64::max);
        rounds.push(Round {
            index,
            order: order
                .iter()
                .map(|&i| group.contenders[i].name.clone())
                .collect(),
            kept: max_other <= settings.max_other_cores,
            max_other_cores: max_other,
            measurements,
        });
    }
    GroupResult {
        backend: group.backend.into(),
        workload: group.workload,
        clients: group.clients,
        contenders: group
            .contenders
            .iter()
            .map(|c| ContenderInfo {
                name: c.name.clone(),
                role: c.role,
                does: c.does.clone(),
                fencing: c.fencing,
            })
            .collect(),
        rounds,
    }
}

/// Warm-up, then the measured window with CPU samples at both ends.
async fn measure(contender: &Contender, group: &Group, settings: &Settings) -> Measurement {
    let warmup = Duration::from_secs_f64(settings.warmup_s);
    let window = Duration::from_secs_f64(settings.measure_s);
    match &contender.job {
        Job::Cycle(cycle) => {
            let _ = cycles(cycle, group.clients, warmup).await;
            let before = Sample::now(&group.server_pids);
            let started = Instant::now();
            let tally = cycles(cycle, group.clients, window).await;
            let elapsed = started.elapsed();
            let cpu = Sample::now(&group.server_pids).usage_since(&before);
            tally.into_measurement(&contender.name, elapsed, cpu)
        }
        Job::Handoff(handoff) => {
            let _ = handoffs(handoff, group.clients, warmup).await;
            let before = Sample::now(&group.server_pids);
            let started = Instant::now();
            let tally = handoffs(handoff, group.clients, window).await;
            let elapsed = started.elapsed();
            let cpu = Sample::now(&group.server_pids).usage_since(&before);
            tally.into_measurement(&contender.name, elapsed, cpu)
        }
    }
}

struct Tally {
    histogram: Histogram<u64>,
    ops: u64,
    barged: u64,
    granted_before_release_returned: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            // 1 ns to 1 h, 3 significant figures: constants hdrhistogram accepts.
            histogram: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("constant, valid histogram bounds"),
            ops: 0,
            barged: 0,
            granted_before_release_returned: 0,
            errors: 0,
            first_error: None,
        }
    }

    fn record(&mut self, sample: Duration) {
        let nanos = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.histogram.saturating_record(nanos);
    }

    fn error(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }

    fn merge(&mut self, other: Tally) {
        let _ = self.histogram.add(&other.histogram);
        self.ops += other.ops;
        self.barged += other.barged;
        self.granted_before_release_returned += other.granted_before_release_returned;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn into_measurement(self, name: &str, elapsed: Duration, cpu: Usage) -> Measurement {
        Measurement {
            contender: name.into(),
            ops: self.ops,
            ops_per_s: self.ops as f64 / elapsed.as_secs_f64().max(1e-9),
            latency: quantiles(&self.histogram),
            errors: self.errors,
            first_error: self.first_error,
            cpu,
            barged: self.barged,
            granted_before_release_returned: self.granted_before_release_returned,
        }
    }
}

fn quantiles(histogram: &Histogram<u64>) -> Quantiles {
    if histogram.is_empty() {
        return Quantiles::default();
    }
    let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    let mut curve: Vec<(f64, f64)> = (1..100)
        .map(|p| p as f64 / 100.0)
        .map(|q| (q, us(q)))
        .collect();
    for q in [0.995, 0.999, 0.9999, 1.0] {
        curve.push((q, us(q)));
    }
    Quantiles {
        p50_us: us(0.5),
        p90_us: us(0.9),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: histogram.max() as f64 / 1000.0,
        curve,
    }
}

/// A pause after an error, so a failing contender does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

async fn cycles(cycle: &Cycle, clients: usize, window: Duration) -> Tally {
    let deadline = Instant::now() + window;
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let cycle = cycle.clone();
            tokio::spawn(async move {
                let mut tally = Tally::new();
                loop {
                    let started = Instant::now();
                    if started >= deadline {
                        break;
                    }
                    match cycle(client).await {
                        Ok(()) => {
                            tally.record(started.elapsed());
                            tally.ops += 1;
                        }
                        Err(error) => {
                            tally.error(error);
                            tokio::time::sleep(ERROR_PAUSE).await;
                        }
                    }
                }
                tally
            })
        })
        .collect();
    collect(tasks).await
}

/// How long each holder of the contended key holds it: far longer than a
/// loopback round trip, so every other client is waiting when it releases.
pub const HOLD: Duration = Duration::from_millis(1);

/// One grant: when the client started waiting, when the grant returned,
/// when the release was sent and when it returned.
#[derive(Clone, Copy)]
struct Grant {
    started: Instant,
    granted: Instant,
    release_sent: Instant,
    released: Instant,
}

/// Every client loops: wait for the key, hold it for [`HOLD`], release it,
/// then wait until another client has been granted it before trying again,
/// so a releaser never simply re-takes the lock it just gave up and every
/// other client is already waiting at each release. Gaps are
/// computed afterwards from all grants sorted by time (the key is
/// exclusive, so grant i+1 follows release i), over the handoffs to a
/// client that was already waiting when the previous holder was granted.
async fn handoffs(handoff: &Handoff, clients: usize, window: Duration) -> Tally {
    let deadline = Instant::now() + window;
    // A wait still under way at the deadline ends with the next releases;
    // past this, a contender that hangs is reported, not waited for.
    let hang = window + Duration::from_secs(10);
    let (grants, _) = tokio::sync::watch::channel(0u64);
    let grants = Arc::new(grants);
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (handoff, grants, count) = (handoff.clone(), grants.clone(), count.clone());
            tokio::spawn(async move {
                let mut log = Vec::new();
                let mut errors = Vec::new();
                let mut others = grants.subscribe();
                while Instant::now() < deadline {
                    let started = Instant::now();
                    let release = match tokio::time::timeout(hang, handoff(client)).await {
                        Ok(Ok(release)) => release,
                        Ok(Err(error)) => {
                            errors.push(error);
                            tokio::time::sleep(ERROR_PAUSE).await;
                            continue;
                        }
                        Err(_) => {
                            errors.push(format!("no grant within {hang:?}"));
                            break;
                        }
                    };
                    let granted = Instant::now();
                    let mine = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    grants.send_modify(|n| *n = (*n).max(mine));
                    // Hold it long enough for the previous holder, woken by
                    // this grant, to start waiting again.
                    tokio::time::sleep(HOLD).await;
                    let release_sent = Instant::now();
                    if let Err(error) = release().await {
                        errors.push(error);
                    }
                    log.push(Grant {
                        started,
                        granted,
                        release_sent,
                        released: Instant::now(),
                    });
                    // Rejoin once someone else holds it (or at the deadline).
                    let _ =
                        tokio::time::timeout_at(deadline.into(), others.wait_for(|&n| n > mine))
                            .await;
                }
                (log, errors)
            })
        })
        .collect();
    let mut log = Vec::new();
    let mut tally = Tally::new();
    for task in tasks {
        match task.await {
            Ok((mine, errors)) => {
                log.extend(mine);
                for error in errors {
                    tally.error(error);
                }
            }
            Err(panic) => tally.error(format!("client task failed: {panic}")),
        }
    }
    log.sort_by_key(|g| g.granted);
    for pair in log.windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        if next.granted > deadline {
            break;
        }
        tally.ops += 1;
        if next.started < previous.granted {
            // From the release being sent: the next grant cannot return
            // before that, so nothing is clamped. (From the release
            // returning, a server that answers the waiter before the
            // releaser gives a negative gap, which an unsigned histogram
            // would read as 0; those handoffs are counted instead.)
            tally.record(next.granted.duration_since(previous.release_sent));
            if next.granted < previous.released {
                tally.granted_before_release_returned += 1;
            }
        } else {
            tally.barged += 1;
        }
    }
    tally
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> Tally {
    let mut total = Tally::new();
    for task in tasks {
        match task.await {
            Ok(tally) => total.merge(tally),
            Err(panic) => total.error(format!("client task failed: {panic}")),
        }
    }
    total
}
