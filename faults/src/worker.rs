//! A worker: one OS process (this binary's hidden `worker` subcommand), so
//! that SIGKILL and SIGSTOP hit a real holder with real connections.
//!
//! Loop until SIGTERM: `lock(key, ttl, wait)`; on a grant, a hold of a random
//! 100–300 ms (the profile's range) made of several fenced writes carrying
//! the fencing token and one read-sleep-write of the unfenced counter; then
//! `release()`. Every step is an [`EventKind`] on stdout.
//!
//! The hold honours the lost signal the way distlock asks users to
//! (`lost_signal().early_by(drift_margin(ttl))`, as `with_lock` does): a
//! running process stops its work before the lock can be someone else's.
//! What no process can honour is a pause: the wait before each write races
//! the lost signal with the write's timer polled first, so a holder resumed
//! after SIGSTOP finds its timer due and writes at once, as a program paused
//! between its last check and its write would. That stale write is what the
//! fenced register must reject.
//!
//! SIGUSR1 asks the worker to keep its current grant until the lost signal
//! fires (or `linger` passes): the orchestrator uses it to keep a victim
//! holding while a fault takes seconds to be noticed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use distlock::{drift_margin, KeepAlive, Lease, Locker};
use rand::Rng;
use tokio::signal::unix::{signal, SignalKind};

use crate::events::{Emitter, EventKind};
use crate::register::RegisterClient;

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
    let mut stop = stop_on_sigterm()?;
    let linger = flag_on(SignalKind::user_defined1())?;
    let locker = distlock::connect(&args.url)
        .await
        .map_err(|err| format!("cannot open {}: {err}", args.url))?;
    let mut register = RegisterClient::connect(&args.register, args.id)
        .await
        .map_err(|err| format!("cannot reach the register at {}: {err}", args.register))?;
    let ttl = Duration::from_millis(args.ttl_ms);
    let wait = Duration::from_millis(args.wait_ms);
    emitter.emit(EventKind::Ready);
    let mut grant = 0;
    while !*stop.borrow() {
        let attempt = crate::events::now_ns();
        let outcome = tokio::select! {
            outcome = locker.lock(&args.key, ttl, wait) => outcome,
            // A dropped lock() is cancel-safe: nothing is granted to us.
            _ = stop.changed() => break,
        };
        match outcome {
            Ok(lease) => {
                grant += 1;
                emitter.emit(EventKind::Acquired {
                    grant,
                    token: lease.fencing_token(),
                    attempt,
                });
                let hold = Hold {
                    args,
                    emitter,
                    grant,
                    linger: &linger,
                };
                hold.run(&*locker, lease, &mut register).await?;
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
    linger: &'a AtomicBool,
}

impl Hold<'_> {
    async fn run(
        &self,
        locker: &dyn Locker,
        mut lease: Lease,
        register: &mut RegisterClient,
    ) -> Result<(), String> {
        let ttl = lease.ttl();
        if locker.capabilities().expires && locker.capabilities().refresh {
            lease
                .keep_alive(KeepAlive::default())
                .map_err(|err| format!("keep_alive: {err}"))?;
        }
        self.watch_lost(&lease);
        let token = lease.fencing_token();
        let mut lost = lease.lost_signal().early_by(drift_margin(ttl));
        let planned = rand::rng().random_range(self.args.hold_min_ms..=self.args.hold_max_ms);
        let writes = u64::from(self.args.writes.max(1));
        let gap = Duration::from_millis(planned / (writes + 1));
        let linger_for = Duration::from_millis(self.args.linger_ms);
        let mut lingering_since = None;
        let mut step = 0;
        let stopped_by = loop {
            if self.linger.swap(false, Ordering::SeqCst) && lingering_since.is_none() {
                self.emitter
                    .emit(EventKind::Lingering { grant: self.grant });
                lingering_since = Some(tokio::time::Instant::now());
            }
            let keep_going =
                step < writes || lingering_since.is_some_and(|since| since.elapsed() < linger_for);
            if !keep_going {
                break None;
            }
            tokio::select! {
                // The timer first: after a pause both are ready, and the
                // paused program writes before it looks (see the module docs).
                biased;
                () = tokio::time::sleep(gap) => {}
                reason = lost.wait() => break Some(reason.to_string()),
            }
            let accepted = register
                .write(self.grant, token)
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
            step += 1;
        };
        self.emitter.emit(EventKind::HoldEnded {
            grant: self.grant,
            lost: stopped_by,
        });
        let error = lease.release().await.err().map(|err| err.to_string());
        self.emitter.emit(EventKind::Released {
            grant: self.grant,
            error,
        });
        // A SIGUSR1 that arrived after this hold's last look is for no one.
        self.linger.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Logs the lease's lost signal firing (not for the worker's own
    /// release), on a task that ends with the lease.
    fn watch_lost(&self, lease: &Lease) {
        let mut signal = lease.lost_signal();
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
            .read_counter()
            .await
            .map_err(|err| format!("register read: {err}"))?;
        tokio::time::sleep(pause).await;
        register
            .set_counter(read.saturating_add(1))
            .await
            .map_err(|err| format!("register set: {err}"))?;
        self.emitter.emit(EventKind::Incremented {
            grant: self.grant,
            read,
        });
        Ok(())
    }
}
