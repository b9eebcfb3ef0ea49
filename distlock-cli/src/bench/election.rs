//! The two election workloads: how long an election is without a leader
//! when the leader resigns (handoff) and when it is SIGKILLed (failover).
//!
//! Both time with this process's monotonic clock ([`Instant`],
//! `CLOCK_MONOTONIC`), to the nanosecond; what limits them is when this
//! process gets to read the clock, a scheduler wake-up (tens of µs on an
//! idle machine, more on a busy one).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use distlock::elect::Election;
use distlock::{Error, Locker};

use super::report::{Common, FailoverRun, HandoffRun, Run};
use super::stats::Latencies;
use super::Plan;

/// Candidates in the handoff workload: the leader and the one waiting.
pub(crate) const CANDIDATES: usize = 2;
/// `distlock elect` processes in the failover workload: the leader and two
/// standbys, as in a typical deployment (and the CLI's own elect tests).
pub(crate) const REPLICAS: usize = 3;

/// How long the waiting candidate has to be waiting before the leader
/// resigns: far longer than the few loopback round trips a campaign takes
/// to start waiting (a subscription, a queued lock, a watch), so the handoff
/// measured is the notification's, not the campaign's start.
const CAMPAIGN_SETTLE: Duration = Duration::from_millis(100);
/// How long the failover workload lets the standbys campaign before it
/// kills the leader: a replacement replica was just started, and must have
/// connected and be waiting, like the standbys of a deployment that has run
/// for a while.
const REPLICA_SETTLE: Duration = Duration::from_millis(500);
/// How long the first leader of the failover workload may take to start,
/// on top of one ttl (a leftover lock from an earlier, killed bench).
const FIRST_LEADER: Duration = Duration::from_secs(30);
/// How long a failover may take on top of one ttl before the run gives up.
const FAILOVER_LIMIT: Duration = Duration::from_secs(10);
/// How often [`until_free`] looks again.
const FREE_POLL: Duration = Duration::from_millis(100);
/// How long a replica may take to exit after SIGTERM before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// The leader's command in the failover workload: prints its term, the
/// moment this bench times as "the new leader's CMD is running", then waits
/// to be stopped. `exec` keeps it one process.
const LEADER_CMD: &str = r#"echo "term $DISTLOCK_TERM"; exec sleep 86400"#;

/// Handoff: one candidate leads, the other campaigns (waits); the leader
/// resigns at t0, and the waiting candidate's `campaign` returns at t1;
/// the handoff is t1 − t0. The waiting candidate is a [`Standby`]: a client
/// of its own on a thread and runtime of its own, as a second replica's
/// process would be, so its wake-up does not wait for the leader's thread.
/// Each run also times, by the leader's client on a free key, a cycle
/// (`try_lock`, then `release`), an `inspect`, and a release after the
/// same quiet the resign follows (nobody waiting), so the handoff can be
/// compared with the backend's own round trips measured in the same
/// seconds, like with like.
pub(crate) async fn handoff(locker: &Arc<dyn Locker>, plan: &Plan) -> (Run, Vec<String>) {
    let key = format!("{}-election", plan.prefix);
    let free = format!("{}-free", plan.prefix);
    let keys = vec![key.clone(), free.clone()];
    let started = Instant::now();
    let mut tally = ElectionTally::new();
    // Bound every wait: a candidate that waits forever would hang the bench.
    let wait = Some(plan.ttl.saturating_mul(2).max(FAILOVER_LIMIT));
    let (name, ttl) = (key.clone(), plan.ttl);
    let election = move |locker: Arc<dyn Locker>| {
        Election::new(locker, name.clone())
            .ttl(ttl)
            .proclaim("distlock-bench")
    };
    let leader = election(locker.clone());
    let standby = match Standby::start(&plan.url, election, wait).await {
        Ok(standby) => standby,
        Err(error) => {
            tally.note(error);
            return (tally.handoff_run(&**locker, plan, started.elapsed()), keys);
        }
    };
    for _ in 0..plan.runs {
        // The backend's round trip and lock cycle, between handoffs.
        let before = Instant::now();
        match locker.inspect(&free).await {
            Ok(_) => tally.inspect.record(before.elapsed()),
            Err(error) => tally.error(&error),
        }
        let before = Instant::now();
        match locker.try_lock(&free, plan.ttl).await {
            Ok(Some(lease)) => match lease.release().await {
                Ok(()) => tally.cycle.record(before.elapsed()),
                Err(error) => tally.error(&error),
            },
            Ok(None) => tally.note(format!("the free key {free:?} was held")),
            Err(error) => tally.error(&error),
        }
        // The resign below is a release after CAMPAIGN_SETTLE of quiet: time
        // the same, with nobody waiting, as its like-for-like reference. A
        // round trip after a pause costs several times a back-to-back one
        // (the client's threads and the server wake from idle), so the hot
        // cycle above is no yardstick for it.
        match locker.try_lock(&free, plan.ttl).await {
            Ok(Some(lease)) => {
                tokio::time::sleep(CAMPAIGN_SETTLE).await;
                let before = Instant::now();
                match lease.release().await {
                    Ok(()) => tally.idle_release.record(before.elapsed()),
                    Err(error) => tally.error(&error),
                }
            }
            Ok(None) => tally.note(format!("the free key {free:?} was held")),
            Err(error) => tally.error(&error),
        }

        let term = match leader.campaign(wait).await {
            Ok(term) => term,
            Err(error) => {
                tally.error(&error);
                continue;
            }
        };
        let Some(mut elected) = standby.campaign() else {
            tally.note("the waiting candidate's thread stopped".into());
            break;
        };
        tokio::time::sleep(CAMPAIGN_SETTLE).await;
        if !matches!(
            elected.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ) {
            tally.note("the waiting candidate was elected while the leader led".into());
        }
        let resigning = Instant::now();
        let resigned = term.resign().await;
        let resign_took = resigning.elapsed();
        match resigned {
            Ok(()) => tally.resign.record(resign_took),
            Err(error) => tally.error(&error),
        }
        match elected.await {
            Ok(Ok(at)) => {
                // Before the resign began would be two leaders at once.
                match at.checked_duration_since(resigning) {
                    Some(handoff) if !handoff.is_zero() => {
                        tally.measured.record(handoff);
                        tally.done += 1;
                    }
                    _ => tally.note("the next leader was elected before the resign".into()),
                }
            }
            Ok(Err(error)) => tally.error(&error),
            Err(_) => {
                tally.note("the waiting candidate's thread stopped".into());
                break;
            }
        }
    }
    (tally.handoff_run(&**locker, plan, started.elapsed()), keys)
}

/// What the standby answers a campaign with: when it was elected (it has
/// resigned again since), or why not.
type Elected = tokio::sync::oneshot::Receiver<distlock::Result<Instant>>;
/// Where the standby sends that answer.
type Reply = tokio::sync::oneshot::Sender<distlock::Result<Instant>>;

/// The handoff's waiting candidate: a thread running a one-threaded
/// runtime with its own connection to the backend. Each request is one
/// campaign; once elected it notes the moment, resigns, and answers. It
/// stops when this is dropped.
struct Standby {
    requests: tokio::sync::mpsc::UnboundedSender<Reply>,
}

impl Standby {
    /// Connects on the new thread and returns once connected.
    async fn start(
        url: &str,
        election: impl FnOnce(Arc<dyn Locker>) -> Election + Send + 'static,
        wait: Option<Duration>,
    ) -> Result<Standby, String> {
        let (requests, mut incoming) = tokio::sync::mpsc::unbounded_channel::<Reply>();
        let (ready, connected) = tokio::sync::oneshot::channel();
        let url = url.to_owned();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| format!("cannot start the standby's runtime: {error}"))?;
        std::thread::Builder::new()
            .name("bench-standby".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let locker = match distlock::connect(&url).await {
                        Ok(locker) => locker,
                        Err(error) => {
                            let _ = ready.send(Err(error));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    let election = election(locker);
                    while let Some(reply) = incoming.recv().await {
                        let elected = match election.campaign(wait).await {
                            Ok(term) => {
                                let at = Instant::now();
                                term.resign().await.map(|()| at)
                            }
                            Err(error) => Err(error),
                        };
                        let _ = reply.send(elected);
                    }
                });
            })
            .map_err(|error| format!("cannot start the standby's thread: {error}"))?;
        match connected.await {
            Ok(Ok(())) => Ok(Standby { requests }),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("the standby's thread stopped".into()),
        }
    }

    /// Starts one campaign; `None` if the thread is gone.
    fn campaign(&self) -> Option<Elected> {
        let (reply, elected) = tokio::sync::oneshot::channel();
        self.requests.send(reply).ok()?;
        Some(elected)
    }
}

/// Failover: [`REPLICAS`] `distlock elect --once` processes (this binary)
/// campaign for one election, each running [`LEADER_CMD`] while it leads.
/// Per run: wait [`REPLICA_SETTLE`], SIGKILL the leader's distlock process
/// at t0 (its command dies with it, killed by its watchdog), and read the
/// next leader's command's first line from that replica's stdout at t1;
/// the failover is t1 − t0. A fresh replica replaces the killed one, so
/// every kill finds two standbys waiting. The terms must increase.
pub(crate) async fn failover(locker: &Arc<dyn Locker>, plan: &Plan) -> (Run, Vec<String>) {
    let key = format!("{}-election", plan.prefix);
    let setup = FailoverSetup {
        key: key.clone(),
        url: plan.url.clone(),
        ttl: plan.ttl,
        runs: plan.runs,
    };
    let started = Instant::now();
    // Blocking reads and waits, off the CLI's one runtime thread.
    let tally = match tokio::task::spawn_blocking(move || setup.measure()).await {
        Ok(tally) => tally,
        Err(panic) => {
            let mut tally = ElectionTally::new();
            tally.note(format!("the failover measurement failed: {panic}"));
            tally
        }
    };
    let run = tally.failover_run(&**locker, plan, started.elapsed());
    until_free(&**locker, &key, plan.ttl.saturating_add(FAILOVER_LIMIT)).await;
    (run, vec![key])
}

/// Waits, up to `limit`, until `key` can be locked: a replica stopped by
/// SIGTERM while campaigning can leave its campaign's key behind until its
/// ttl runs out (on etcd, a queued key on the replica's lease), and the
/// caller can only forget a free key.
async fn until_free(locker: &dyn Locker, key: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match locker.try_lock(key, limit).await {
            Ok(Some(lease)) => {
                // Whatever fails here, the caller's forget reports.
                let _ = lease.release().await;
                return;
            }
            Ok(None) => tokio::time::sleep(FREE_POLL).await,
            Err(_) => return,
        }
    }
}

/// What the failover workload needs, moved to its blocking thread.
struct FailoverSetup {
    key: String,
    url: String,
    ttl: Duration,
    runs: usize,
}

/// A line a replica printed, when this process read it.
struct Line {
    replica: usize,
    at: Instant,
    text: String,
    /// From stderr (distlock's own messages) rather than stdout (CMD's).
    stderr: bool,
}

/// The running replicas; every one still running is killed when this is
/// dropped, so a run that gives up leaves no process behind.
struct Replicas {
    children: Vec<(usize, Child)>,
    lines: mpsc::Sender<Line>,
    next_id: usize,
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl FailoverSetup {
    fn measure(self) -> ElectionTally {
        let mut tally = ElectionTally::new();
        let (sender, lines) = mpsc::channel();
        let mut replicas = Replicas {
            children: Vec::new(),
            lines: sender,
            next_id: 0,
        };
        for _ in 0..REPLICAS {
            if let Err(error) = replicas.start(&self) {
                tally.note(format!("cannot start a replica: {error}"));
                return tally;
            }
        }
        let Some((mut leader, mut term)) = next_leader(
            &lines,
            None,
            self.ttl.saturating_add(FIRST_LEADER),
            &mut tally,
        ) else {
            return tally;
        };
        for _ in 0..self.runs {
            std::thread::sleep(REPLICA_SETTLE);
            // Anything a standby printed meanwhile (a leader while the
            // leader led would show here).
            while let Ok(line) = lines.try_recv() {
                tally.unexpected(&line);
            }
            let killed = Instant::now();
            if let Err(error) = replicas.kill(leader) {
                tally.note(format!("cannot SIGKILL the leader: {error}"));
                return tally;
            }
            let limit = self.ttl.saturating_add(FAILOVER_LIMIT);
            let Some((next, next_term)) = next_leader(&lines, Some(leader), limit, &mut tally)
            else {
                return tally;
            };
            let (replica, at) = next;
            match at.checked_duration_since(killed) {
                Some(failover) if !failover.is_zero() => {
                    tally.measured.record(failover);
                    tally.done += 1;
                }
                _ => tally.note(format!("replica {replica} led before the kill")),
            }
            if let (Some(before), Some(after)) = (term, next_term) {
                if after <= before {
                    tally.note(format!("term {after} followed term {before}"));
                }
            }
            (leader, term) = (next, next_term);
            if let Err(error) = replicas.start(&self) {
                tally.note(format!("cannot start a replica: {error}"));
                return tally;
            }
        }
        replicas.stop(&mut tally);
        tally
    }
}

/// Waits up to `limit` for a replica other than `not` to print its
/// command's first line; returns the replica with the moment the line was
/// read, and its term (`None` on a backend without fencing). Lines from
/// distlock itself are noted as errors.
fn next_leader(
    lines: &mpsc::Receiver<Line>,
    not: Option<(usize, Instant)>,
    limit: Duration,
    tally: &mut ElectionTally,
) -> Option<((usize, Instant), Option<u64>)> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(_) => {
                tally.note(format!(
                    "no new leader's command started within {}",
                    humantime::format_duration(limit)
                ));
                return None;
            }
        };
        let from_leader = not.is_some_and(|(replica, _)| replica == line.replica);
        match line.text.strip_prefix("term ") {
            Some(term) if !line.stderr && !from_leader => {
                return Some(((line.replica, line.at), term.trim().parse().ok()));
            }
            _ => tally.unexpected(&line),
        }
    }
}

impl Replicas {
    /// Starts one more replica, its stdout and stderr read line by line on
    /// threads of their own, so each line is timed as soon as it arrives.
    fn start(&mut self, setup: &FailoverSetup) -> std::io::Result<()> {
        let exe = std::env::current_exe()?;
        let id = self.next_id;
        self.next_id += 1;
        let ttl = humantime::format_duration(setup.ttl).to_string();
        let mut child = Command::new(exe)
            .args(["elect", "--once", "--key", &setup.key, "--ttl", &ttl])
            .args(["--url", &setup.url])
            .args(["--proclaim", &format!("replica-{id}")])
            .args(["--", "sh", "-c", LEADER_CMD])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(stdout) = child.stdout.take() {
            read_lines(stdout, id, false, self.lines.clone());
        }
        if let Some(stderr) = child.stderr.take() {
            read_lines(stderr, id, true, self.lines.clone());
        }
        self.children.push((id, child));
        Ok(())
    }

    /// SIGKILLs the replica `leader` names and reaps it.
    fn kill(&mut self, leader: (usize, Instant)) -> std::io::Result<()> {
        let Some(index) = self.children.iter().position(|(id, _)| *id == leader.0) else {
            return Err(std::io::Error::other(format!(
                "replica {} is not running",
                leader.0
            )));
        };
        let (_, mut child) = self.children.swap_remove(index);
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// SIGTERMs every replica (the leader stops its command and resigns;
    /// the standbys stop campaigning) and waits for each to exit.
    fn stop(mut self, tally: &mut ElectionTally) {
        for (_, child) in &self.children {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) on a child of this process, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + STOP_LIMIT;
        for (id, mut child) in std::mem::take(&mut self.children) {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Ok(None) | Err(_) => {
                        tally.note(format!(
                            "replica {id} did not exit within {} of SIGTERM",
                            humantime::format_duration(STOP_LIMIT)
                        ));
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

/// Sends every line of `source` to `lines`, timed when read.
fn read_lines(
    source: impl Read + Send + 'static,
    replica: usize,
    stderr: bool,
    lines: mpsc::Sender<Line>,
) {
    std::thread::spawn(move || {
        for text in BufReader::new(source).lines().map_while(Result::ok) {
            let at = Instant::now();
            let line = Line {
                replica,
                at,
                text,
                stderr,
            };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
}

/// What an election workload counted.
struct ElectionTally {
    /// Handoffs or failovers.
    measured: Latencies,
    resign: Latencies,
    /// A release after [`CAMPAIGN_SETTLE`] of quiet, nobody waiting.
    idle_release: Latencies,
    inspect: Latencies,
    cycle: Latencies,
    done: u64,
    errors: u64,
    first_error: Option<String>,
}

impl ElectionTally {
    fn new() -> Self {
        ElectionTally {
            measured: Latencies::new(),
            resign: Latencies::new(),
            idle_release: Latencies::new(),
            inspect: Latencies::new(),
            cycle: Latencies::new(),
            done: 0,
            errors: 0,
            first_error: None,
        }
    }

    fn error(&mut self, error: &Error) {
        self.note(error.to_string());
    }

    fn note(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }

    /// A line no replica should have printed then: an error, unless it is
    /// distlock's own (a standby's stderr is where a failure would show).
    fn unexpected(&mut self, line: &Line) {
        let source = if line.stderr { "stderr" } else { "stdout" };
        self.note(format!(
            "replica {} printed on {source}: {}",
            line.replica, line.text
        ));
    }

    fn common(
        &self,
        locker: &dyn Locker,
        plan: &Plan,
        clients: usize,
        elapsed: Duration,
    ) -> Common {
        Common {
            backend: locker.backend(),
            clients,
            duration_s: elapsed.as_secs_f64(),
            ttl_s: plan.ttl.as_secs_f64(),
            errors: self.errors,
            first_error: self.first_error.clone(),
        }
    }

    fn handoff_run(&self, locker: &dyn Locker, plan: &Plan, elapsed: Duration) -> Run {
        let handoff_us = self.measured.summary();
        let cycle_us = self.cycle.summary();
        let idle_release_us = self.idle_release.summary();
        Run::Handoff(HandoffRun {
            common: self.common(locker, plan, CANDIDATES, elapsed),
            handoffs: self.done,
            handoff_us,
            resign_us: self.resign.summary(),
            cycle_us,
            inspect_us: self.inspect.summary(),
            handoff_per_cycle: (cycle_us.p50 > 0.0).then(|| handoff_us.p50 / cycle_us.p50),
            idle_release_us,
            handoff_per_idle_release: (idle_release_us.p50 > 0.0)
                .then(|| handoff_us.p50 / idle_release_us.p50),
        })
    }

    fn failover_run(&self, locker: &dyn Locker, plan: &Plan, elapsed: Duration) -> Run {
        Run::Failover(FailoverRun {
            common: self.common(locker, plan, REPLICAS, elapsed),
            failovers: self.done,
            failover_us: self.measured.summary(),
        })
    }
}
