//! A worker: one OS process (this binary's hidden `worker` subcommand), so
//! that SIGKILL and SIGSTOP hit a real holder with real connections.
//!
//! Loop until SIGTERM: `lock(key, ttl, wait)`; on a grant, a hold of a random
//! 100–300 ms (the profile's range) made of several fenced writes carrying
//! the fencing token and one read-sleep-write of the unfenced counter; then
//! `release()`. Every step is an [`EventKind`] on stdout.
//!
//! The election workload (`--workload election`) runs the same loop on
//! `distlock::elect`: a grant is a term won by `Election::campaign` (the key
//! is the election's name), its fencing token is the term number, and the
//! hold ends with `Term::resign()`. Only how a hold is obtained and ended
//! differs ([`Contender`], [`Grant`]); the hold itself is the same code, so
//! both workloads are judged by the same analysis.
//!
//! The semaphore workload (`--workload semaphore`) runs it on
//! `distlock::semaphore`: a grant is a permit of the semaphore of
//! `--permits` N named by the key (`Semaphore::acquire`), a lease on the
//! permit's key `key#i` with that permit's fencing token, kept alive as a
//! lock's lease is, and ended by `release()`. The worker reports which
//! permit it holds, and writes to that permit's register and counter: each
//! permit is a lock of its own, fenced by its own tokens.
//!
//! The hold honours the lost signal the way distlock asks users to
//! (`lost_signal().early_by(drift_margin(ttl))`, as `with_lock` does): a
//! running process stops its work before the lock can be someone else's.
//! What no process can honour is a pause: the wait before each write races
//! the lost signal with the write's timer polled first, and the writes are
//! due on a schedule from the grant, so a holder resumed after SIGSTOP
//! (wherever it was stopped) finds a write overdue and makes it at once, as
//! a program paused between its last check and its write would; it looks
//! after each write, so it makes one. That stale write is what the fenced
//! register must reject.
//!
//! SIGUSR1 asks the worker to keep its current grant until the lost signal
//! fires (or `linger` passes): the orchestrator uses it to keep a victim
//! holding while a fault takes seconds to be noticed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use distlock::elect::{Election, Term};
use distlock::semaphore::Semaphore;
use distlock::{drift_margin, KeepAlive, Lease, Locker, LostSignal};
use rand::Rng;
use tokio::signal::unix::{signal, SignalKind};

use crate::events::{Emitter, EventKind};
use crate::register::RegisterClient;
use crate::scenario::Workload;

/// The worker's command line, filled in by the orchestrator.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The backend's URL.
    #[arg(long)]
    pub url: String,
    /// The lock's key.
    #[arg(long)]
    pub key: String,
    /// The worker's index in its run.
    #[arg(long)]
    pub id: u32,
    /// The fenced register's address.
    #[arg(long)]
    pub register: String,
    /// The lease's ttl, in milliseconds.
    #[arg(long)]
    pub ttl_ms: u64,
    /// How long `lock()` waits, in milliseconds.
    #[arg(long)]
    pub wait_ms: u64,
    /// The shortest hold, in milliseconds.
    #[arg(long)]
    pub hold_min_ms: u64,
    /// The longest hold, in milliseconds.
    #[arg(long)]
    pub hold_max_ms: u64,
    /// Fenced writes per hold.
    #[arg(long, default_value_t = 4)]
    pub writes: u32,
    /// How long a lingering grant (SIGUSR1) is kept at most, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub linger_ms: u64,
    /// Contenders in this process, each with its own connections, numbered
    /// from `id`: for deployments that need no process faults (PgBouncer),
    /// where contenders in one process share tokio-postgres' process-wide
    /// statement names instead of colliding on a shared server session.
    #[arg(long, default_value_t = 1)]
    pub contenders: u32,
    /// Contend with `distlock::postgres::try_lock_xact` inside a transaction
    /// of a plain tokio-postgres connection, instead of a `Locker`.
    #[arg(long)]
    pub xact: bool,
    /// How a hold is obtained and ended: a lock's lease, an election's
    /// term, or a semaphore's permit.
    #[arg(long, value_enum, default_value_t = Workload::Lock)]
    pub workload: Workload,
    /// The semaphore's permits (N), in the semaphore workload.
    #[arg(long, default_value_t = 2)]
    pub permits: u32,
}

/// Runs the worker until SIGTERM; the exit code is 0, or 2 if it could not
/// start (the event log says why).
pub fn main(args: &WorkerArgs) -> i32 {
    let emitter = Emitter::new(args.id);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            emitter.emit(EventKind::Failed {
                message: format!("cannot start the runtime: {err}"),
            });
            return 2;
        }
    };
    match runtime.block_on(run(args, emitter)) {
        Ok(()) => 0,
        Err(message) => {
            emitter.emit(EventKind::Failed { message });
            2
        }
    }
}

async fn run(args: &WorkerArgs, emitter: Emitter) -> Result<(), String> {
    let stop = stop_on_sigterm()?;
    let linger = flag_on(SignalKind::user_defined1())?;
    let mut contenders = tokio::task::JoinSet::new();
    for offset in 0..args.contenders.max(1) {
        let (args, stop, linger) = (args.clone(), stop.clone(), linger.clone());
        let id = args.id.saturating_add(offset);
        contenders.spawn(async move {
            let emitter = Emitter::new(id);
            let outcome = if args.xact {
                contend_xact(&args, emitter, stop).await
            } else {
                contend(&args, emitter, stop, &linger).await
            };
            if let Err(message) = &outcome {
                emitter.emit(EventKind::Failed {
                    message: message.clone(),
                });
            }
            outcome
        });
    }
    let mut failed = None;
    while let Some(outcome) = contenders.join_next().await {
        if let Ok(Err(message)) | Err(message) =
            outcome.map_err(|err| format!("a contender panicked: {err}"))
        {
            failed = Some(message);
        }
    }
    let _ = emitter;
    failed.map_or(Ok(()), Err)
}

/// One contender on a [`Locker`], directly or through an [`Election`].
async fn contend(
    args: &WorkerArgs,
    emitter: Emitter,
    mut stop: tokio::sync::watch::Receiver<bool>,
    linger: &AtomicBool,
) -> Result<(), String> {
    let locker = distlock::connect(&args.url)
        .await
        .map_err(|err| format!("cannot open {}: {err}", args.url))?;
    let mut register = connect_register(args, emitter).await?;
    let ttl = Duration::from_millis(args.ttl_ms);
    let wait = Duration::from_millis(args.wait_ms);
    // Kept alive as `with_lock` does; a lock that neither expires nor
    // refreshes has nothing to keep alive.
    let keep_alive = locker.capabilities().expires && locker.capabilities().refresh;
    let contender = match args.workload {
        Workload::Lock => Contender::Lock { locker, keep_alive },
        Workload::Semaphore => Contender::Semaphore {
            semaphore: Semaphore::new(locker, args.key.clone(), args.permits)
                .map_err(|err| format!("semaphore {:?}: {err}", args.key))?,
            keep_alive,
        },
        Workload::Election => Contender::Election(
            Election::new(locker, args.key.clone())
                .ttl(ttl)
                // Exercises the holder label a term records (Observer,
                // `distlock status`); nothing reads it here.
                .proclaim(format!("faults-worker-{}", emitter.worker())),
        ),
    };
    emitter.emit(EventKind::Ready);
    let mut grant = 0;
    while !*stop.borrow() {
        let attempt = crate::events::now_ns();
        let outcome = tokio::select! {
            outcome = contender.obtain(&args.key, ttl, wait) => outcome,
            // A dropped lock(), acquire() or campaign() is cancel-safe:
            // nothing is granted to us.
            _ = stop.changed() => break,
        };
        match outcome {
            Ok(held) => {
                let granted_at = tokio::time::Instant::now();
                grant += 1;
                emitter.emit(EventKind::Acquired {
                    grant,
                    token: held.fencing_token(),
                    attempt,
                    permit: held.permit(),
                });
                let hold = Hold {
                    args,
                    emitter,
                    grant,
                    permit: held.permit(),
                    linger,
                    granted_at,
                };
                hold.run(held, &mut register).await?;
            }
            Err(err) => {
                emitter.emit(EventKind::Refused {
                    attempt,
                    contention: err.is_contention(),
                    outage: err.is_outage(),
                    kind: err.kind_name().to_owned(),
                    message: err.to_string(),
                });
                // An outage can answer at once: do not spin on it.
                if !err.is_contention() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    Ok(())
}

/// How a contender obtains a hold: the workload's one difference at the
/// start of a hold. `keep_alive`: the lease is kept alive (the backend's
/// locks expire and can be refreshed).
enum Contender {
    Lock {
        locker: Arc<dyn Locker>,
        keep_alive: bool,
    },
    Semaphore {
        semaphore: Semaphore,
        keep_alive: bool,
    },
    Election(Election),
}

impl Contender {
    /// One attempt: waits up to `wait`.
    async fn obtain(&self, key: &str, ttl: Duration, wait: Duration) -> distlock::Result<Grant> {
        match self {
            Contender::Lock { locker, keep_alive } => {
                let lease = locker.lock(key, ttl, wait).await?;
                kept_alive(lease, *keep_alive).map(Grant::Lease)
            }
            Contender::Semaphore {
                semaphore,
                keep_alive,
            } => {
                let lease = semaphore.acquire(ttl, wait).await?;
                // Which permit: the one whose key the lease holds.
                let permit = (0..semaphore.permits())
                    .find(|&index| semaphore.permit_key(index) == lease.key())
                    .ok_or_else(|| {
                        distlock::Error::invalid(
                            "permit",
                            format!("{:?} is none of the semaphore's permit keys", lease.key()),
                        )
                    })?;
                let lease = kept_alive(lease, *keep_alive)?;
                Ok(Grant::Permit { lease, permit })
            }
            // The term comes kept alive by the election itself.
            Contender::Election(election) => election.campaign(Some(wait)).await.map(Grant::Term),
        }
    }
}

/// `lease`, kept alive if `keep_alive` (as `with_lock` does).
fn kept_alive(mut lease: Lease, keep_alive: bool) -> distlock::Result<Lease> {
    if keep_alive {
        // It fails only outside a runtime; the dropped lease is then
        // released in the background.
        lease.keep_alive(KeepAlive::default())?;
    }
    Ok(lease)
}

/// A hold obtained by any workload: what the hold's work needs of it, and
/// how it ends (the workload's other difference).
enum Grant {
    Lease(Lease),
    /// A semaphore's permit `permit`: a lease on its permit key.
    Permit {
        lease: Lease,
        permit: u32,
    },
    Term(Term),
}

impl Grant {
    fn fencing_token(&self) -> Option<u64> {
        match self {
            Grant::Lease(lease) | Grant::Permit { lease, .. } => lease.fencing_token(),
            Grant::Term(term) => term.fencing_token(),
        }
    }

    /// The semaphore permit held, if it is one.
    fn permit(&self) -> Option<u32> {
        match self {
            Grant::Permit { permit, .. } => Some(*permit),
            Grant::Lease(_) | Grant::Term(_) => None,
        }
    }

    fn lost_signal(&self) -> LostSignal {
        match self {
            Grant::Lease(lease) | Grant::Permit { lease, .. } => lease.lost_signal(),
            Grant::Term(term) => term.lost_signal(),
        }
    }

    fn ttl(&self) -> Duration {
        match self {
            Grant::Lease(lease) | Grant::Permit { lease, .. } => lease.ttl(),
            Grant::Term(term) => term.lease().ttl(),
        }
    }

    /// `release()` or `resign()`.
    async fn end(self) -> distlock::Result<()> {
        match self {
            Grant::Lease(lease) | Grant::Permit { lease, .. } => lease.release().await,
            Grant::Term(term) => term.resign().await,
        }
    }
}

/// One contender on transaction-scoped advisory locks: each grant is a
/// transaction, released by its `COMMIT`. No fencing token, no lost signal:
/// the transaction is the lock.
async fn contend_xact(
    args: &WorkerArgs,
    emitter: Emitter,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    let (mut client, connection) = tokio_postgres::connect(&args.url, tokio_postgres::NoTls)
        .await
        .map_err(|err| format!("cannot connect to {}: {err}", args.url))?;
    tokio::spawn(connection);
    let mut register = connect_register(args, emitter).await?;
    let key = distlock::postgres::advisory_key("", &args.key);
    let linger = AtomicBool::new(false);
    emitter.emit(EventKind::Ready);
    let mut grant = 0;
    while !*stop.borrow() {
        let attempt = crate::events::now_ns();
        let refused = |contention: bool, message: String| EventKind::Refused {
            attempt,
            contention,
            outage: !contention,
            kind: if contention {
                "not_acquired"
            } else {
                "backend_error"
            }
            .to_owned(),
            message,
        };
        let transaction = match client.transaction().await {
            Ok(transaction) => transaction,
            Err(err) => {
                emitter.emit(refused(false, format!("begin: {err}")));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match distlock::postgres::try_lock_xact(&transaction, key).await {
            Ok(true) => {
                let granted_at = tokio::time::Instant::now();
                grant += 1;
                emitter.emit(EventKind::Acquired {
                    grant,
                    token: None,
                    attempt,
                    permit: None,
                });
                let hold = Hold {
                    args,
                    emitter,
                    grant,
                    permit: None,
                    linger: &linger,
                    granted_at,
                };
                let lost = hold.work(&mut register, None, None).await?;
                emitter.emit(EventKind::HoldEnded { grant, lost });
                let error = transaction.commit().await.err().map(|err| err.to_string());
                emitter.emit(EventKind::Released { grant, error });
            }
            Ok(false) => {
                emitter.emit(refused(true, "held elsewhere".to_owned()));
                drop(transaction);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(err) => {
                emitter.emit(refused(false, err.to_string()));
                drop(transaction);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    Ok(())
}

async fn connect_register(args: &WorkerArgs, emitter: Emitter) -> Result<RegisterClient, String> {
    RegisterClient::connect(&args.register, emitter.worker())
        .await
        .map_err(|err| format!("cannot reach the register at {}: {err}", args.register))
}

/// Becomes true at SIGTERM: the worker finishes its hold, releases, exits.
fn stop_on_sigterm() -> Result<tokio::sync::watch::Receiver<bool>, String> {
    let mut stream =
        signal(SignalKind::terminate()).map_err(|err| format!("cannot handle SIGTERM: {err}"))?;
    let (set, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if stream.recv().await.is_some() {
            let _ = set.send(true);
        }
        // Keep the sender, so `changed()` does not fire for its drop.
        std::future::pending::<()>().await;
    });
    Ok(stop)
}

/// A flag set when `kind` arrives.
fn flag_on(kind: SignalKind) -> Result<Arc<AtomicBool>, String> {
    let mut stream = signal(kind).map_err(|err| format!("cannot handle a signal: {err}"))?;
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    tokio::spawn(async move {
        while stream.recv().await.is_some() {
            set.store(true, Ordering::SeqCst);
        }
    });
    Ok(flag)
}

/// One grant's work.
struct Hold<'a> {
    args: &'a WorkerArgs,
    emitter: Emitter,
    grant: u64,
    /// The semaphore permit held: the register and counter it writes.
    permit: Option<u32>,
    linger: &'a AtomicBool,
    /// When the grant arrived: the hold's writes are due on a schedule from
    /// here, so a holder resumed from SIGSTOP finds its next write overdue
    /// wherever it was stopped (module docs).
    granted_at: tokio::time::Instant,
}

impl Hold<'_> {
    async fn run(&self, held: Grant, register: &mut RegisterClient) -> Result<(), String> {
        self.watch_lost(held.lost_signal());
        let token = held.fencing_token();
        // The signal `Lease::run_while_held` and `Term::run_while_leader`
        // race work against, raced here by `work` itself: their race is
        // unbiased, so a holder resumed from SIGSTOP would make its stale
        // write or not at random; `work` makes it always (module docs).
        let lost = held.lost_signal().early_by(drift_margin(held.ttl()));
        let stopped_by = self.work(register, token, Some(lost)).await?;
        self.emitter.emit(EventKind::HoldEnded {
            grant: self.grant,
            lost: stopped_by,
        });
        let error = held.end().await.err().map(|err| err.to_string());
        self.emitter.emit(EventKind::Released {
            grant: self.grant,
            error,
        });
        // A SIGUSR1 that arrived after this hold's last look is for no one.
        self.linger.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// The hold's writes, stopped early by `lost` (if any) firing; returns
    /// its reason then.
    async fn work(
        &self,
        register: &mut RegisterClient,
        token: Option<u64>,
        mut lost: Option<LostSignal>,
    ) -> Result<Option<String>, String> {
        let planned = rand::rng().random_range(self.args.hold_min_ms..=self.args.hold_max_ms);
        let writes = u64::from(self.args.writes.max(1));
        let gap = Duration::from_millis(planned / (writes + 1));
        let linger_for = Duration::from_millis(self.args.linger_ms);
        let mut lingering_since = None;
        let mut step = 0;
        loop {
            if self.linger.swap(false, Ordering::SeqCst) && lingering_since.is_none() {
                self.emitter
                    .emit(EventKind::Lingering { grant: self.grant });
                lingering_since = Some(tokio::time::Instant::now());
            }
            let keep_going =
                step < writes || lingering_since.is_some_and(|since| since.elapsed() < linger_for);
            if !keep_going {
                return Ok(None);
            }
            let lost_fired = async {
                match lost.as_mut() {
                    Some(lost) => lost.wait().await,
                    None => std::future::pending().await,
                }
            };
            // Due on the schedule, not `gap` after the last step: a holder
            // stopped anywhere (in this wait, a write, the increment, before
            // its first write) has its next write overdue when resumed.
            let due = u32::try_from(step.saturating_add(1))
                .ok()
                .and_then(|steps| gap.checked_mul(steps))
                .and_then(|since_grant| self.granted_at.checked_add(since_grant))
                .ok_or("the hold's write schedule overflowed")?;
            tokio::select! {
                // The timer first: after a pause both are ready, and the
                // paused program writes before it looks (see the module docs).
                biased;
                () = tokio::time::sleep_until(due) => {}
                reason = lost_fired => return Ok(Some(reason.to_string())),
            }
            let accepted = register
                .write(self.grant, token, self.permit)
                .await
                .map_err(|err| format!("register write: {err}"))?;
            self.emitter.emit(EventKind::Wrote {
                grant: self.grant,
                token,
                accepted,
            });
            if step == writes / 2 {
                self.increment(register, gap / 2).await?;
            }
            // It looks after each write: one stale write after a pause, not
            // a burst of every overdue one.
            if let Some(reason) = lost.as_ref().and_then(LostSignal::reason) {
                return Ok(Some(reason.to_string()));
            }
            step += 1;
        }
    }

    /// Logs the lease's (or term's) lost signal firing (not for the worker's
    /// own release), on a task that ends with the lease.
    fn watch_lost(&self, mut signal: LostSignal) {
        let (emitter, grant) = (self.emitter, self.grant);
        tokio::spawn(async move {
            let reason = signal.wait().await;
            if reason != distlock::LostReason::Released {
                emitter.emit(EventKind::Lost {
                    grant,
                    reason: reason.to_string(),
                });
            }
        });
    }

    /// The unfenced read-sleep-write.
    async fn increment(
        &self,
        register: &mut RegisterClient,
        pause: Duration,
    ) -> Result<(), String> {
        let read = register
            .read_counter(self.permit)
            .await
            .map_err(|err| format!("register read: {err}"))?;
        tokio::time::sleep(pause).await;
        register
            .set_counter(self.permit, read.saturating_add(1))
            .await
            .map_err(|err| format!("register set: {err}"))?;
        self.emitter.emit(EventKind::Incremented {
            grant: self.grant,
            read,
        });
        Ok(())
    }
}
