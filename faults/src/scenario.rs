//! The registry (backend × fault × expectation) and one run of one cell.
//!
//! Adding a backend is one entry in [`registry`]: how to start its
//! deployment (a file in `deploy/`), whether it has fencing tokens, and the
//! faults that apply to it, each with what the suite expects (exclusive, or a
//! known break it asserts) and the bound on how long a lock may stay orphaned.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use test_servers::netns::{self, Direction, Partition};
use test_servers::FaultProxy;

use crate::analysis::{self, Figures, Observed};
use crate::deploy::{self, Deployment, Holder};
use crate::events::{now_ns, Event, EventKind, EventLog};
use crate::register::Register;

/// A fault the suite injects into the holder or its servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL of the holder.
    Kill,
    /// SIGSTOP of the holder for longer than its ttl, then SIGCONT.
    Pause,
    /// nftables drops the holder's connections both ways.
    Blackhole,
    /// nftables drops what the holder sends (the server stops hearing it).
    BlackholeOutgoing,
    /// nftables drops what the holder receives (it stops hearing the server).
    BlackholeIncoming,
    /// The holder's connections are reset (a proxy between it and the
    /// server resets both ends, as a middlebox would).
    Reset,
    /// The server ends the holder's session.
    EndSession,
    /// The server is killed and started again.
    Restart,
    /// Redis: the lock's write reaches the master only (replica paused, link
    /// dropped), then the master is killed and the replica promoted.
    Failover,
    /// etcd: the leader is killed (a new one is elected, the old member
    /// rejoins).
    LeaderKill,
    /// A majority of the nodes is killed for longer than the ttl, then
    /// started again.
    MajorityLoss,
    /// No fault: the deployment itself is under test (PgBouncer).
    None,
}

impl Fault {
    /// Every fault, in table order.
    pub const ALL: [Fault; 12] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Blackhole,
        Fault::BlackholeOutgoing,
        Fault::BlackholeIncoming,
        Fault::Reset,
        Fault::EndSession,
        Fault::Restart,
        Fault::Failover,
        Fault::LeaderKill,
        Fault::MajorityLoss,
        Fault::None,
    ];

    /// Its name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Blackhole => "blackhole",
            Fault::BlackholeOutgoing => "blackhole-out",
            Fault::BlackholeIncoming => "blackhole-in",
            Fault::Reset => "reset",
            Fault::EndSession => "end-session",
            Fault::Restart => "restart",
            Fault::Failover => "failover",
            Fault::LeaderKill => "leader-kill",
            Fault::MajorityLoss => "majority-loss",
            Fault::None => "none",
        }
    }

    /// The fault hits the servers, so every holder at once, not only the
    /// victim: what matters where several hold at once (a semaphore's
    /// permits).
    pub fn hits_every_holder(self) -> bool {
        matches!(
            self,
            Fault::Restart | Fault::Failover | Fault::LeaderKill | Fault::MajorityLoss
        )
    }

    /// The victim must still hold the lock while the fault takes effect,
    /// which may take seconds: it is asked to linger (SIGUSR1).
    fn needs_linger(self) -> bool {
        !matches!(self, Fault::Kill | Fault::Pause | Fault::None)
    }
}

/// What the workers do with the lock: the same faults, backends and
/// expectations apply to all, because an election is a lock (its terms are
/// the lock's grants, kept alive) and a semaphore of N permits is N locks
/// (each permit judged as a lock, and at most N holders at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// `Locker::lock`, a hold, `Lease::release`.
    Lock,
    /// `Election::campaign`, a hold as leader, `Term::resign`: the held
    /// intervals are terms, the fencing token is the term number.
    Election,
    /// `Semaphore::acquire` of one of the profile's N permits, a hold,
    /// `Lease::release`: each permit is a lock with its own fencing tokens
    /// and register, and the holds of all permits may overlap N at a time.
    Semaphore,
}

impl Workload {
    /// Every workload, in table order.
    pub const ALL: [Workload; 3] = [Workload::Lock, Workload::Election, Workload::Semaphore];

    /// Its name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Lock => "lock",
            Workload::Election => "election",
            Workload::Semaphore => "semaphore",
        }
    }

    /// Whether `backend`'s workers can run it: an election and a semaphore
    /// need a `Locker`, which the transaction-scoped contenders do not use.
    pub fn runs_on(self, backend: &Backend) -> bool {
        self == Workload::Lock || backend.workers != Workers::OneProcessXact
    }

    /// The most holders it allows at once under `profile`: the semaphore's
    /// permits; `None` for the workloads of one lock, whose limit of one is
    /// what their overlaps count.
    pub fn limit(self, profile: &Profile) -> Option<u32> {
        (self == Workload::Semaphore).then_some(profile.permits)
    }
}

/// What the suite expects of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// No two holds overlap.
    Exclusive,
    /// A known break: holds overlap (each explained by the fault), and where
    /// the backend has fencing tokens the register rejects the stale writes.
    Breaks,
    /// The fault frees the lock on the server and tells the holder at about
    /// the same moment, in no guaranteed order (the session's death is
    /// both): holds may overlap by that race, each explained by the fault,
    /// and the register must reject any stale write where there is fencing.
    Races,
    /// A known break that fencing does not catch either: the fence counter
    /// lives where the lock does and loses the same writes, so a later grant
    /// reuses a token (asserted), and a downstream resource cannot tell the
    /// two holders apart. Whether their holds overlap depends on whether the
    /// old holder hears of the failover first (its connection died with the
    /// master); overlaps must be explained.
    BreaksFencing,
}

/// One backend × fault × workload.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    pub fault: Fault,
    /// [`Workload::Lock`] in the registry; the selection adds a copy of the
    /// cell per further workload, with the same expectation and bound.
    pub workload: Workload,
    pub expect: Expect,
    /// The longest the lock may stay unavailable from the fault to the next
    /// grant (the backend's documented bound, plus the waiters' wake-up).
    pub orphan_bound: Duration,
}

/// One backend's entry.
pub struct Backend {
    /// Its name on the command line and in the table.
    pub name: &'static str,
    /// Its leases carry fencing tokens.
    pub fencing: bool,
    /// Starts its deployment.
    pub start: fn() -> Result<Box<dyn Deployment>, String>,
    /// How its workers run.
    pub workers: Workers,
    /// The faults that apply to it.
    pub cells: Vec<Cell>,
}

/// How a backend's contenders run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One process each, on a `Locker`: SIGKILL and SIGSTOP hit one holder.
    Processes,
    /// All in one process, each with its own connections, on a `Locker`.
    /// Only for cells without process faults: through PgBouncer 1.18 in
    /// transaction mode, tokio-postgres clients of different processes
    /// collide on their prepared statements' names (`s0` already exists on
    /// the shared server session) and cannot even connect; one process
    /// numbers its statements once for all its clients.
    OneProcess,
    /// As `OneProcess`, with `distlock::postgres::try_lock_xact` inside a
    /// transaction instead of a `Locker`.
    OneProcessXact,
}

/// How long and how hard a run is.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Profile {
    pub name: &'static str,
    pub workers: u32,
    pub repetitions: u32,
    pub hold_ms: (u64, u64),
    pub ttl: Duration,
    /// How long `lock()` waits.
    pub wait: Duration,
    /// Grants before the fault.
    pub warmup_grants: usize,
    /// Grants after the first grant that follows the fault.
    pub settle_grants: usize,
    /// The (backend, fault) cells that also run the election workload unless
    /// `--workload` says otherwise; `None`: every cell.
    pub election_cells: Option<&'static [(&'static str, Fault)]>,
    /// The semaphore workload's permits (N): fewer than `workers`, so that
    /// a worker always waits for a permit and a returned one is taken.
    pub permits: u32,
    /// The cells that also run the semaphore workload, as `election_cells`.
    pub semaphore_cells: Option<&'static [(&'static str, Fault)]>,
}

impl Profile {
    /// Short scenarios, one run of each cell (CI).
    pub const QUICK: Profile = Profile {
        name: "quick",
        workers: 3,
        repetitions: 1,
        hold_ms: (100, 300),
        ttl: Duration::from_secs(1),
        wait: Duration::from_secs(2),
        warmup_grants: 3,
        settle_grants: 2,
        // A few cells, to keep CI's run short (about 30 s more): a dead and
        // a paused leader on a session backend of each kind and on both
        // expiring ones with fencing, where a paused leader's term lapses.
        election_cells: Some(&[
            ("file", Fault::Kill),
            ("file", Fault::Pause),
            ("postgres", Fault::Kill),
            ("postgres", Fault::Pause),
            ("redis", Fault::Kill),
            ("redis", Fault::Pause),
            ("etcd", Fault::Kill),
            ("etcd", Fault::Pause),
        ]),
        permits: 2,
        // Fewer still (a few seconds each): a killed holder's permit on
        // session and expiring backends, a paused holder's where it keeps
        // its session (Postgres) and where its permit lapses (Redis: the
        // documented exception, N + 1 holders, fencing rejects the stale
        // write), and a cut-off holder's.
        semaphore_cells: Some(&[
            ("file", Fault::Kill),
            ("postgres", Fault::Kill),
            ("postgres", Fault::Pause),
            ("redis", Fault::Pause),
            ("redis", Fault::Blackhole),
            ("etcd", Fault::Kill),
        ]),
    };

    /// More workers, more repetitions, longer holds.
    pub const FULL: Profile = Profile {
        name: "full",
        workers: 5,
        repetitions: 3,
        hold_ms: (200, 600),
        ttl: Duration::from_secs(2),
        wait: Duration::from_secs(3),
        warmup_grants: 6,
        settle_grants: 6,
        election_cells: None,
        permits: 2,
        semaphore_cells: None,
    };

    /// The workloads `backend` runs `fault` with when `--workload` does not
    /// choose.
    pub fn default_workloads(&self, backend: &Backend, fault: Fault) -> Vec<Workload> {
        let on = |cells: Option<&[(&str, Fault)]>| match cells {
            None => true,
            Some(cells) => cells.contains(&(backend.name, fault)),
        };
        Workload::ALL
            .into_iter()
            .filter(|workload| match workload {
                Workload::Lock => true,
                Workload::Election => on(self.election_cells),
                Workload::Semaphore => on(self.semaphore_cells),
            })
            .filter(|workload| workload.runs_on(backend))
            .collect()
    }

    /// How long a paused holder stays stopped: past its ttl by a second.
    fn pause(&self) -> Duration {
        self.ttl.saturating_add(Duration::from_secs(1))
    }
}

/// The registry: every backend and its cells, with the bounds each
/// backend's docs promise (README, "Backends").
pub fn registry(profile: &Profile) -> Vec<Backend> {
    use Expect::{Breaks, BreaksFencing, Exclusive, Races};
    use Fault::*;
    let ttl = profile.ttl;
    let second = Duration::from_secs(1);
    // A waiter wakes within its poll interval or at once; a paused holder's
    // lock comes back no later than its resume.
    let pause = profile.pause().saturating_add(second);
    let cell = |fault, expect, orphan_bound| Cell {
        fault,
        workload: Workload::Lock,
        expect,
        orphan_bound,
    };
    // Postgres, directly or through a hop: the server ends the session the
    // moment the holder's socket closes; a stopped client keeps its
    // session, so its lock; cut off, the holder is told within 4 s by its
    // pings and stops, and the server ends the silent session 10–12 s after
    // its last statement (keepalive, idle_session_timeout).
    let postgres_session_cells = vec![
        cell(Kill, Exclusive, second),
        cell(Pause, Exclusive, pause),
        cell(Blackhole, Exclusive, Duration::from_secs(15)),
        cell(BlackholeOutgoing, Exclusive, Duration::from_secs(15)),
        cell(BlackholeIncoming, Exclusive, Duration::from_secs(15)),
    ];
    vec![
        Backend {
            name: "file",
            fencing: true,
            start: || Ok(Box::new(deploy::FileDeployment::start()?)),
            workers: Workers::Processes,
            cells: vec![
                // The kernel frees a dead process's flock at once.
                cell(Kill, Exclusive, second),
                // A stopped process keeps its flock: no one else gets it.
                cell(Pause, Exclusive, pause),
            ],
        },
        Backend {
            name: "postgres",
            fencing: true,
            start: || Ok(Box::new(deploy::PostgresDeployment::start()?)),
            workers: Workers::Processes,
            cells: [
                postgres_session_cells.clone(),
                vec![
                    // The session's end frees the lock and tells the holder.
                    cell(Reset, Races, 2 * second),
                    cell(EndSession, Races, 2 * second),
                    // Crash recovery, then a grant.
                    cell(Restart, Races, Duration::from_secs(10)),
                ],
            ]
            .concat(),
        },
        Backend {
            name: "redis",
            fencing: true,
            start: || Ok(Box::new(deploy::RedisDeployment::start()?)),
            workers: Workers::Processes,
            cells: vec![
                // Freed at ttl expiry.
                cell(Kill, Exclusive, ttl.saturating_add(second)),
                // The ttl runs out under a stopped holder: a second holder,
                // and the resumed one's write is stale (Kleppmann's case).
                cell(Pause, Breaks, ttl.saturating_add(second)),
                // The holder's refreshes fail, it stops before its validity
                // ends, the key expires at ttl.
                cell(Blackhole, Exclusive, ttl.saturating_add(2 * second)),
                cell(BlackholeOutgoing, Exclusive, ttl.saturating_add(2 * second)),
                cell(BlackholeIncoming, Exclusive, ttl.saturating_add(2 * second)),
                // The connection reconnects; the lock stays until released
                // or expired.
                cell(Reset, Exclusive, ttl.saturating_add(2 * second)),
                cell(EndSession, Exclusive, ttl.saturating_add(2 * second)),
                // With appendonly the key survives the restart and expires.
                cell(Restart, Exclusive, ttl.saturating_add(3 * second)),
            ],
        },
        Backend {
            name: "sentinel",
            fencing: true,
            start: || Ok(Box::new(deploy::SentinelDeployment::start()?)),
            workers: Workers::Processes,
            cells: vec![
                cell(Kill, Exclusive, ttl.saturating_add(second)),
                cell(Pause, Breaks, ttl.saturating_add(second)),
                cell(Blackhole, Exclusive, ttl.saturating_add(2 * second)),
                cell(EndSession, Exclusive, ttl.saturating_add(2 * second)),
                // Last: it leaves the old master dead. The promoted replica
                // lacks the lock and the fence counter's last increments.
                cell(Failover, BreaksFencing, Duration::from_secs(15)),
            ],
        },
        Backend {
            name: "redlock",
            // Per-node counters do not combine into a sound token.
            fencing: false,
            start: || Ok(Box::new(deploy::RedlockDeployment::start()?)),
            workers: Workers::Processes,
            cells: vec![
                cell(Kill, Exclusive, ttl.saturating_add(second)),
                // No fencing: the paused holder's stale write is accepted.
                cell(Pause, Breaks, ttl.saturating_add(second)),
                cell(Blackhole, Exclusive, ttl.saturating_add(2 * second)),
                cell(EndSession, Exclusive, ttl.saturating_add(2 * second)),
                // One node of three, with appendonly: the majority holds.
                cell(Restart, Exclusive, ttl.saturating_add(3 * second)),
                // No majority: the holder cannot refresh and stops; nobody
                // is granted, and everyone hears an outage, not contention.
                cell(
                    MajorityLoss,
                    Exclusive,
                    pause.saturating_add(ttl).saturating_add(3 * second),
                ),
            ],
        },
        Backend {
            name: "etcd-cluster",
            fencing: true,
            start: || Ok(Box::new(deploy::EtcdClusterDeployment::start()?)),
            workers: Workers::Processes,
            cells: {
                let lease = ttl.max(2 * second);
                vec![
                    // The new leader resets lease ttls; the holder's
                    // keep-alive carries on.
                    cell(LeaderKill, Exclusive, Duration::from_secs(20)),
                    cell(
                        MajorityLoss,
                        Exclusive,
                        pause
                            .saturating_add(lease)
                            .saturating_add(Duration::from_secs(20)),
                    ),
                ]
            },
        },
        Backend {
            name: "etcd",
            fencing: true,
            start: || Ok(Box::new(deploy::EtcdDeployment::start()?)),
            workers: Workers::Processes,
            cells: {
                // Whole seconds, at least etcd's minimum lease ttl; freed
                // one lease ttl after the last keep-alive.
                let lease = ttl.max(2 * second);
                vec![
                    cell(Kill, Exclusive, lease.saturating_add(2 * second)),
                    cell(Pause, Breaks, lease.saturating_add(2 * second)),
                    cell(Blackhole, Exclusive, lease.saturating_add(3 * second)),
                    cell(
                        BlackholeOutgoing,
                        Exclusive,
                        lease.saturating_add(3 * second),
                    ),
                    cell(
                        BlackholeIncoming,
                        Exclusive,
                        lease.saturating_add(3 * second),
                    ),
                    // A revoked lease frees the lock at once; the holder
                    // hears at its next keep-alive, up to ttl/3 later.
                    cell(EndSession, Races, 2 * second),
                    // A restart keeps the lease (its ttl restarts).
                    cell(
                        Restart,
                        Exclusive,
                        lease.saturating_mul(2).saturating_add(5 * second),
                    ),
                ]
            },
        },
        // Postgres through a local TCP hop (an auth proxy, a sidecar, a
        // tunnel): the hop stays up and answers the holder's keepalive while
        // its upstream is cut, so only the holder's pings can tell it.
        Backend {
            name: "postgres-hop",
            fencing: true,
            start: || Ok(Box::new(deploy::PostgresHopDeployment::start()?)),
            workers: Workers::Processes,
            // The hop closes its upstream when the holder's socket does.
            cells: postgres_session_cells,
        },
        // PgBouncer in session mode with its default (2-hour) client
        // keepalive: a holder that goes silent leaves its server session to
        // the pooler, which does not notice; idle_session_timeout ends it.
        Backend {
            name: "pgbouncer-session",
            fencing: true,
            start: || Ok(Box::new(deploy::PgBouncerDeployment::start_session_mode()?)),
            workers: Workers::Processes,
            cells: vec![
                // The pooler resets the server session (DISCARD ALL, which
                // releases advisory locks) when its client disconnects.
                cell(Kill, Exclusive, second),
                cell(Pause, Exclusive, pause),
                cell(Blackhole, Exclusive, Duration::from_secs(15)),
            ],
        },
        // Session locks through a transaction-mode pooler: two clients are
        // handed one server session, where advisory locks are re-entrant,
        // so both are granted (the Postgres backend's docs warn of it).
        Backend {
            name: "pgbouncer",
            fencing: true,
            start: || Ok(Box::new(deploy::PgBouncerDeployment::start()?)),
            workers: Workers::OneProcess,
            cells: vec![cell(None, Breaks, second)],
        },
        // The remedy: transaction-scoped locks, which a pooler never splits.
        Backend {
            name: "pgbouncer-xact",
            fencing: false,
            start: || Ok(Box::new(deploy::PgBouncerDeployment::start()?)),
            workers: Workers::OneProcessXact,
            cells: vec![cell(None, Exclusive, second)],
        },
        Backend {
            name: "mysql",
            fencing: true,
            start: || Ok(Box::new(deploy::MySqlDeployment::start()?)),
            workers: Workers::Processes,
            cells: vec![
                cell(Kill, Exclusive, second),
                cell(Pause, Exclusive, pause),
                // "14–15 s after its host goes silent"; the holder is told
                // within 6 s and stops first.
                cell(Blackhole, Exclusive, Duration::from_secs(18)),
                cell(EndSession, Races, 2 * second),
                cell(Restart, Races, Duration::from_secs(15)),
            ],
        },
        Backend {
            name: "zookeeper",
            // czxids: the ensemble's transaction counter.
            fencing: true,
            start: || Ok(Box::new(deploy::ZooKeeperDeployment::start()?)),
            workers: Workers::Processes,
            cells: {
                // The ttl does not bound a ZooKeeper lock: the session does.
                // A holder no longer heard from keeps its nodes one session
                // timeout, and the server looks for expired sessions every
                // tick (200 ms here); a waiter watching the holder's node
                // is told at once.
                let session = deploy::ZOOKEEPER_SESSION_TIMEOUT;
                let expiry = session.saturating_add(second);
                vec![
                    cell(Kill, Exclusive, expiry),
                    // The session expires under a stopped holder: a second
                    // holder, and the resumed one's write is stale.
                    cell(Pause, Breaks, expiry.max(pause)),
                    // The partition silences the holder's connection, not
                    // the server: zookeeper-client gives the silent
                    // connection up and resumes its session on a new one,
                    // so the holder keeps its lock and releases it as
                    // usual (the orphan time counts from that release).
                    // Had it not been back in time, it would have given up
                    // a drift margin before its session could expire
                    // (tested in distlock's `zookeeper::faults`).
                    cell(Blackhole, Exclusive, expiry.saturating_add(second)),
                    cell(BlackholeOutgoing, Exclusive, expiry.saturating_add(second)),
                    cell(BlackholeIncoming, Exclusive, expiry.saturating_add(second)),
                    // The server restores its sessions from its log: a
                    // holder back within the session timeout keeps its
                    // lock; one that is not loses it, and its lost signal
                    // fires first. A JVM start takes seconds.
                    cell(Restart, Exclusive, Duration::from_secs(20)),
                ]
            },
        },
        Backend {
            name: "zookeeper-ensemble",
            fencing: true,
            start: || Ok(Box::new(deploy::ZooKeeperEnsembleDeployment::start()?)),
            workers: Workers::Processes,
            cells: {
                let session = deploy::ZOOKEEPER_SESSION_TIMEOUT;
                vec![
                    // The holder's session moves to a follower and lives
                    // on (a new leader restores sessions with fresh
                    // timeouts); the lock stays held.
                    cell(LeaderKill, Exclusive, Duration::from_secs(30)),
                    // No quorum: the holder's heartbeats go unanswered, it
                    // stops before its session can expire, nobody is
                    // granted, and everyone hears an outage; after the
                    // quorum returns, a leader election and the sessions'
                    // fresh timeouts, then a grant.
                    cell(
                        MajorityLoss,
                        Exclusive,
                        pause
                            .saturating_add(session)
                            .saturating_add(Duration::from_secs(30)),
                    ),
                ]
            },
        },
    ]
}

/// The outcome of one run of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub backend: &'static str,
    pub fault: Fault,
    pub workload: Workload,
    pub expect: Expect,
    pub repetition: u32,
    pub figures: Figures,
    /// Failed invariants (empty: the run passed).
    pub failures: Vec<String>,
    pub seconds: f64,
    /// Every event of a failed run, to see what happened (empty when it
    /// passed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<crate::events::Event>,
}

/// Runs `cell` once on `deployment`.
pub fn run_cell(
    backend: &Backend,
    deployment: &mut dyn Deployment,
    cell: &Cell,
    profile: &Profile,
    repetition: u32,
) -> RunResult {
    let started = now_ns();
    let outcome = Run::new(backend, deployment, cell, profile, repetition)
        .map_err(|failure| (failure, Vec::new()))
        .and_then(Run::execute);
    let (figures, mut failures, mut events) = match outcome {
        Ok(observed) => {
            let figures = analysis::figures(&observed, cell.fault);
            let failures = analysis::verdict(cell, backend.fencing, &figures);
            (figures, failures, observed.events)
        }
        Err((failure, events)) => (Figures::default(), vec![failure], events),
    };
    failures.dedup();
    if failures.is_empty() {
        events.clear();
    }
    RunResult {
        backend: backend.name,
        fault: cell.fault,
        workload: cell.workload,
        expect: cell.expect,
        repetition,
        figures,
        failures,
        seconds: crate::events::ms_between(started, now_ns()) / 1e3,
        events,
    }
}

/// The holder a fault hits.
struct Victim {
    /// (worker, grant).
    grant: (u32, u64),
    pid: u32,
    /// The semaphore permit it holds.
    permit: Option<u32>,
}

/// One run's moving parts.
struct Run<'a> {
    deployment: &'a mut dyn Deployment,
    layout: Workers,
    cell: Cell,
    profile: Profile,
    /// The lock's key, the election's name or the semaphore's name.
    key: String,
    /// The most holders the workload allows at once (the semaphore's N).
    limit: Option<u32>,
    register: Register,
    /// Proxies in front of the servers (resets only).
    proxies: Vec<FaultProxy>,
    log: EventLog,
    workers: Vec<Child>,
    down: Vec<(u64, u64)>,
}

impl<'a> Run<'a> {
    fn new(
        backend: &Backend,
        deployment: &'a mut dyn Deployment,
        cell: &Cell,
        profile: &Profile,
        repetition: u32,
    ) -> Result<Self, String> {
        let register =
            Register::start().map_err(|err| format!("cannot start the register: {err}"))?;
        let proxies = if cell.fault == Fault::Reset {
            deployment
                .server_ports()
                .into_iter()
                .map(FaultProxy::start)
                .collect()
        } else {
            Vec::new()
        };
        Ok(Run {
            deployment,
            layout: backend.workers,
            cell: *cell,
            profile: *profile,
            key: format!(
                "faults-{}-{}-{}-{repetition}",
                backend.name,
                cell.fault.name(),
                cell.workload.name()
            ),
            limit: cell.workload.limit(profile),
            register,
            proxies,
            log: EventLog::default(),
            workers: Vec::new(),
            down: Vec::new(),
        })
    }

    /// The URL workers use: through the proxies, if any.
    fn worker_url(&self) -> String {
        self.proxies
            .iter()
            .fold(self.deployment.url(), |url, proxy| proxy.proxied_url(&url))
    }

    /// The ports workers connect to.
    fn worker_ports(&self) -> Vec<u16> {
        if self.proxies.is_empty() {
            self.deployment.server_ports()
        } else {
            self.proxies.iter().map(FaultProxy::port).collect()
        }
    }

    /// Runs it; on failure, says why with the events so far.
    fn execute(mut self) -> Result<Observed, (String, Vec<Event>)> {
        let outcome = self.drive();
        let ended_at = now_ns();
        self.stop_workers();
        let (victim, fault_at) = outcome.map_err(|failure| (failure, self.log.snapshot()))?;
        let final_check = self.final_check();
        Ok(Observed {
            events: self.log.snapshot(),
            writes: self.register.writes(),
            counter: self.register.counter(),
            victim,
            fault_at,
            down: std::mem::take(&mut self.down),
            ended_at,
            limit: self.limit,
            final_check,
        })
    }

    /// Workers, warm-up, the fault, recovery; returns the victim and when
    /// the fault was injected.
    fn drive(&mut self) -> Result<((u32, u64), u64), String> {
        self.spawn_workers()?;
        self.wait_for_grants(self.profile.warmup_grants, 0, Duration::from_secs(20))
            .ok_or("no warm-up grants within 20 s")?;
        if self.cell.fault == Fault::None {
            let at = now_ns();
            self.wait_for_grants(self.profile.settle_grants * 2, at, Duration::from_secs(20));
            return Ok(((u32::MAX, 0), at));
        }
        if self.cell.fault == Fault::Failover {
            self.deployment.prepare_failover()?;
        }
        let Victim {
            grant: victim,
            pid,
            permit,
        } = self.pick_victim()?;
        let holder = Holder {
            key: self.lock_key(permit),
            pid,
            local_ports: self.holder_ports(pid),
        };
        let fault_at = now_ns();
        let partition = self.inject(&holder)?;
        let recovery = self
            .cell
            .orphan_bound
            .saturating_add(Duration::from_secs(5));
        // The next grant of the lock the victim held (its permit: the
        // others' are no sign of recovery).
        let next = self.log.wait_for(recovery, |event| match event.kind {
            EventKind::Acquired {
                grant,
                permit: granted,
                ..
            } if event.at > fault_at && (event.worker, grant) != victim && granted == permit => {
                Some(())
            }
            _ => None,
        });
        drop(partition);
        if next.is_some() {
            self.wait_for_grants(
                self.profile.settle_grants,
                fault_at,
                Duration::from_secs(10),
            );
        }
        Ok((victim, fault_at))
    }

    fn spawn_workers(&mut self) -> Result<(), String> {
        let url = self.worker_url();
        let exe = std::env::current_exe()
            .map_err(|err| format!("cannot find this program to start workers: {err}"))?;
        let (processes, contenders) = match self.layout {
            Workers::Processes => (self.profile.workers, 1),
            Workers::OneProcess | Workers::OneProcessXact => (1, self.profile.workers),
        };
        for id in 0..processes {
            let mut command = Command::new(&exe);
            command
                .arg("worker")
                .args(["--url", &url, "--key", &self.key])
                .args(["--id", &id.to_string()])
                .args(["--register", &self.register.address()])
                .args(["--ttl-ms", &millis(self.profile.ttl)])
                .args(["--wait-ms", &millis(self.profile.wait)])
                .args(["--hold-min-ms", &self.profile.hold_ms.0.to_string()])
                .args(["--hold-max-ms", &self.profile.hold_ms.1.to_string()])
                // A victim that keeps its lock through the fault lets go
                // within the bound, so the run can end.
                .args(["--linger-ms", &millis(self.cell.orphan_bound)])
                .args(["--contenders", &contenders.to_string()])
                .args(["--workload", self.cell.workload.name()])
                .args(["--permits", &self.profile.permits.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            if self.layout == Workers::OneProcessXact {
                command.arg("--xact");
            }
            let mut child = test_servers::spawn_tied_to_this_process(command)
                .map_err(|err| format!("cannot start a worker: {err}"))?;
            if let Some(stdout) = child.stdout.take() {
                self.log.collect(stdout);
            }
            self.workers.push(child);
        }
        let workers = self.profile.workers as usize;
        let mut ready = 0;
        self.log
            .wait_for(Duration::from_secs(20), |event| match &event.kind {
                EventKind::Ready => {
                    ready += 1;
                    (ready == workers).then_some(Ok(()))
                }
                EventKind::Failed { message } => {
                    Some(Err(format!("worker {} failed: {message}", event.worker)))
                }
                _ => None,
            })
            .unwrap_or_else(|| Err("the workers did not start within 20 s".to_owned()))
    }

    /// Waits for `count` grants after `after`; `None` on timeout.
    fn wait_for_grants(&self, count: usize, after: u64, timeout: Duration) -> Option<()> {
        let mut seen = 0;
        self.log.wait_for(timeout, |event| match event.kind {
            EventKind::Acquired { .. } if event.at > after => {
                seen += 1;
                (seen >= count).then_some(())
            }
            _ => None,
        })
    }

    /// The next worker to be granted the lock, asked to linger if the fault
    /// needs it.
    fn pick_victim(&mut self) -> Result<Victim, String> {
        for _ in 0..10 {
            let after = now_ns();
            let (granted, permit) = self
                .log
                .wait_for(Duration::from_secs(10), |event| match event.kind {
                    EventKind::Acquired { grant, permit, .. } if event.at > after => {
                        Some(((event.worker, grant), permit))
                    }
                    _ => None,
                })
                .ok_or("no grant to pick a victim from within 10 s")?;
            let pid = self.workers[granted.0 as usize].id();
            let victim = Victim {
                grant: granted,
                pid,
                permit,
            };
            if !self.cell.fault.needs_linger() {
                return Ok(victim);
            }
            test_servers::signal(pid, libc::SIGUSR1);
            let lingering = self
                .log
                .wait_for(Duration::from_secs(2), |event| match event.kind {
                    EventKind::Lingering { grant } if (event.worker, grant) == granted => {
                        Some(true)
                    }
                    EventKind::HoldEnded { grant, .. } if (event.worker, grant) == granted => {
                        Some(false)
                    }
                    _ => None,
                });
            if lingering == Some(true) {
                return Ok(victim);
            }
        }
        Err("no holder would linger for the fault".to_owned())
    }

    /// The holder's local ports on its connections to the servers.
    fn holder_ports(&self, pid: u32) -> Vec<u16> {
        let servers = self.worker_ports();
        netns::tcp_connections_of(pid)
            .into_iter()
            .filter(|connection| servers.contains(&connection.remote_port))
            .map(|connection| connection.local_port)
            .collect()
    }

    /// Injects the fault; a partition is returned, to be healed later.
    fn inject(&mut self, holder: &Holder) -> Result<Option<Partition>, String> {
        let partition_ports = self.deployment.partition_ports(holder);
        let cut = |direction| {
            if partition_ports.is_empty() {
                return Err("the holder has no connection to cut".to_owned());
            }
            Ok(Some(Partition::start(&partition_ports, direction)))
        };
        match self.cell.fault {
            Fault::Kill => {
                test_servers::signal(holder.pid, libc::SIGKILL);
                Ok(None)
            }
            Fault::Pause => {
                let paused_at = now_ns();
                test_servers::signal(holder.pid, libc::SIGSTOP);
                std::thread::sleep(self.profile.pause());
                self.wait_for_successor_write(paused_at);
                test_servers::signal(holder.pid, libc::SIGCONT);
                Ok(None)
            }
            Fault::Blackhole => cut(Direction::Both),
            Fault::BlackholeOutgoing => cut(Direction::Outgoing),
            Fault::BlackholeIncoming => cut(Direction::Incoming),
            Fault::Reset => {
                let cut: usize = self
                    .proxies
                    .iter()
                    .map(|proxy| proxy.cut_clients(&holder.local_ports))
                    .sum();
                if cut == 0 {
                    return Err("the holder has no connection through the proxy".to_owned());
                }
                Ok(None)
            }
            Fault::EndSession => self.deployment.end_session(holder).map(|()| None),
            Fault::Restart => self.down_while(|deployment| deployment.restart()),
            Fault::Failover => self.down_while(|deployment| deployment.fail_over()),
            Fault::LeaderKill => self.deployment.kill_leader().map(|()| None),
            Fault::None => Ok(None),
            Fault::MajorityLoss => {
                // Known down from the moment the kills are done to the moment
                // the first member is started again: before, the cluster
                // still answers; after, it may have its majority back and a
                // "held" answer may be true.
                self.deployment.lose_majority()?;
                let from = now_ns();
                std::thread::sleep(self.profile.pause());
                self.down.push((from, now_ns()));
                self.deployment.regain_majority().map(|()| None)
            }
        }
    }

    /// Where the paused holder's lock went to another worker (the lease ran
    /// out under it), waits until that successor's first write reached the
    /// register, at most `SUCCESSOR_WRITE_WAIT`: Kleppmann's case is the
    /// stale write arriving after the newer holder's, and a resume between
    /// the successor's grant and its first write would make a stale write
    /// the register had no newer token to reject. Where nobody took the
    /// lock (a session that outlives a stopped client) there is nothing to
    /// wait for. Every grant since `paused_at` is a successor's: the paused
    /// process emits nothing.
    fn wait_for_successor_write(&self, paused_at: u64) {
        const SUCCESSOR_WRITE_WAIT: Duration = Duration::from_secs(3);
        let successors: Vec<(u32, u64)> = self
            .log
            .snapshot()
            .iter()
            .filter_map(|event| match event.kind {
                EventKind::Acquired { grant, .. } if event.at > paused_at => {
                    Some((event.worker, grant))
                }
                _ => None,
            })
            .collect();
        if successors.is_empty() {
            return;
        }
        let _ = self
            .log
            .wait_for(SUCCESSOR_WRITE_WAIT, |event| match event.kind {
                EventKind::Wrote { grant, .. } if successors.contains(&(event.worker, grant)) => {
                    Some(())
                }
                _ => None,
            });
    }

    /// Runs `outage` on the deployment, recording the servers as down
    /// meanwhile.
    fn down_while(
        &mut self,
        outage: impl FnOnce(&mut dyn Deployment) -> Result<(), String>,
    ) -> Result<Option<Partition>, String> {
        let from = now_ns();
        let outcome = outage(&mut *self.deployment);
        self.down.push((from, now_ns()));
        outcome.map(|()| None)
    }

    /// SIGTERM (after SIGCONT, for a paused one) to every worker: it ends its
    /// hold, releases and exits; SIGKILL after 10 s.
    fn stop_workers(&mut self) {
        for worker in &self.workers {
            // SAFETY: kill has no memory-safety preconditions; a worker that
            // is gone already makes it fail harmlessly.
            unsafe {
                libc::kill(worker.id() as libc::pid_t, libc::SIGCONT);
                libc::kill(worker.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for worker in &mut self.workers {
            while matches!(worker.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }

    /// The key of the lock a grant of `permit` holds: the semaphore's
    /// permit key, or the run's key.
    fn lock_key(&self, permit: Option<u32>) -> String {
        permit.map_or_else(|| self.key.clone(), |permit| permit_key(&self.key, permit))
    }

    /// Takes and releases the lock (each of the semaphore's permits in
    /// turn) from the orchestrator, waiting at most the orphan bound in
    /// all: a lock nobody can take then was never released.
    fn final_check(&self) -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| format!("cannot start a runtime: {err}"))?;
        let keys: Vec<String> = match self.limit {
            Some(permits) => (0..permits)
                .map(|permit| self.lock_key(Some(permit)))
                .collect(),
            None => vec![self.key.clone()],
        };
        runtime.block_on(async {
            let locker = distlock::connect(&self.deployment.check_url())
                .await
                .map_err(|err| format!("final check: cannot connect: {err}"))?;
            let deadline = tokio::time::Instant::now() + self.cell.orphan_bound;
            for key in &keys {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let lease = locker
                    .lock(key, self.profile.ttl, left)
                    .await
                    .map_err(|err| format!("final check: {key}: {err}"))?;
                lease
                    .release()
                    .await
                    .map_err(|err| format!("final check: {key}: release: {err}"))?;
            }
            Ok(())
        })
    }
}

/// The key of permit `permit` of the semaphore `name`: `name#permit`, the
/// layout `distlock::semaphore` documents (and `distlock list --prefix
/// 'name#'` relies on); a test checks it against `Semaphore::permit_key`.
fn permit_key(name: &str, permit: u32) -> String {
    format!("{name}#{permit}")
}

fn millis(duration: Duration) -> String {
    duration.as_millis().to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use distlock::memory::MemoryLocker;
    use distlock::semaphore::Semaphore;

    use super::*;

    #[test]
    fn the_orchestrators_permit_keys_are_the_semaphores() {
        let semaphore = Semaphore::new(Arc::new(MemoryLocker::new()), "faults-run", 3)
            .expect("a valid semaphore");
        for permit in 0..3 {
            assert_eq!(
                permit_key("faults-run", permit),
                semaphore.permit_key(permit)
            );
        }
    }

    #[test]
    fn every_profile_leaves_a_worker_waiting_for_a_permit() {
        for profile in [Profile::QUICK, Profile::FULL] {
            assert!(
                (1..profile.workers).contains(&profile.permits),
                "{}: {} permits for {} workers",
                profile.name,
                profile.permits,
                profile.workers
            );
            assert_eq!(Workload::Semaphore.limit(&profile), Some(profile.permits));
            assert_eq!(Workload::Lock.limit(&profile), None);
        }
    }
}
