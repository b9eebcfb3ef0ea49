//! `distlock run` and `distlock release`.

use std::io;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use distlock::{Error, KeepAlive, Lease, Locker, LockerExt};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::cli::{Backend, ReleaseArgs, RunArgs};
use crate::exit;

/// Acquires the lock, runs CMD under it, and returns the exit code.
pub(crate) async fn run(args: RunArgs) -> u8 {
    let locker = match open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return fail(&error),
    };
    let wait = args.wait.unwrap_or(Duration::ZERO);
    let mut lease = match locker.lock(&args.key, args.ttl, wait).await {
        Ok(lease) => lease,
        Err(error) if error.is_contention() => {
            let waited = args
                .wait
                .map(|w| format!(" after waiting {}", humantime::format_duration(w)))
                .unwrap_or_default();
            eprintln!("distlock: lock {:?} is held elsewhere{waited}", args.key);
            return args.conflict_exit_code;
        }
        Err(error) => return fail(&error),
    };
    let mut keepalive = KeepAlive::default();
    if let Some(max_hold) = args.max_hold {
        keepalive = keepalive.max_hold(max_hold);
    }
    if let Err(error) = lease.keep_alive(keepalive) {
        return fail(&error);
    }
    let code = supervise(&args, &lease).await;
    match lease.release().await {
        Ok(()) | Err(Error::NotHeld { .. }) => {}
        Err(error) => eprintln!(
            "distlock: releasing {:?} failed: {error}; it is freed when its ttl runs out",
            args.key
        ),
    }
    code
}

/// Releases a lock by owner token, from any process where the backend allows it.
pub(crate) async fn release(args: ReleaseArgs) -> u8 {
    let locker = match open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return fail(&error),
    };
    match locker.unlock(&args.key, &args.owner).await {
        Ok(()) => 0,
        Err(Error::NotHeld { key }) => {
            eprintln!("distlock: lock {key:?} is not held by that owner (released, expired or taken over); nothing was released");
            exit::NOT_HELD
        }
        Err(error) => fail(&error),
    }
}

/// The backend the URL names, observed: metrics (served with --metrics-addr)
/// and spans (logged at --log-level info and above).
async fn open(backend: &Backend) -> distlock::Result<Arc<dyn Locker>> {
    let locker = distlock::connect(backend.url.as_deref().unwrap_or("file://")).await?;
    Ok(locker.with_metrics().with_tracing().shared())
}

fn fail(error: &Error) -> u8 {
    eprintln!("distlock: {error}");
    exit::for_error(error)
}

/// Runs CMD until it exits, forwarding signals, and stops it if the lock is lost.
async fn supervise(args: &RunArgs, lease: &Lease) -> u8 {
    let mut child = match spawn(args, lease) {
        Ok(child) => child,
        Err(error) => {
            eprintln!("distlock: cannot run {:?}: {error}", args.command[0]);
            return match error.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    let mut signals = match ForwardedSignals::install() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("distlock: cannot install signal handlers: {error}");
            stop(&mut child, args.kill_after).await;
            return exit::SOFTWARE;
        }
    };
    let mut lost = lease.lost_signal();
    loop {
        tokio::select! {
            status = child.wait() => return match status {
                Ok(status) => status_code(status),
                Err(error) => {
                    eprintln!("distlock: waiting for the command failed: {error}");
                    exit::SOFTWARE
                }
            },
            signal = signals.recv() => forward(&child, signal),
            reason = lost.wait() => {
                eprintln!("distlock: lock {:?} lost ({reason}); stopping the command", args.key);
                stop(&mut child, args.kill_after).await;
                return exit::LOST;
            }
        }
    }
}

fn spawn(args: &RunArgs, lease: &Lease) -> io::Result<Child> {
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("DISTLOCK_KEY", lease.key())
        .env("DISTLOCK_OWNER", lease.owner())
        .kill_on_drop(true);
    match lease.fencing_token() {
        Some(token) => command.env("DISTLOCK_FENCING_TOKEN", token.to_string()),
        None => command.env_remove("DISTLOCK_FENCING_TOKEN"),
    };
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid); it allocates nothing on
    // the success path.
    unsafe {
        command.pre_exec(move || {
            // If distlock dies, even by SIGKILL, the command must not run on
            // without the lock.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // distlock died between fork and prctl: the signal will never come.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::other(
                    "distlock exited before the command started",
                ));
            }
            Ok(())
        });
    }
    // Lock files and sockets are opened close-on-exec, so CMD inherits none.
    command.spawn()
}

/// SIGTERM, then SIGKILL if CMD is still running after `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    forward(child, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "distlock: the command ignored SIGTERM for {}; killing it",
            humantime::format_duration(grace)
        );
        let _ = child.kill().await;
    }
}

fn forward(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: kill has no memory-safety preconditions; the child is not
        // yet reaped (we hold its handle), so the pid is still ours.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
    }
}

/// CMD's exit status as distlock's: its code, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => exit::SOFTWARE,
    }
}

/// The signals distlock passes on to CMD.
struct ForwardedSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
    user1: Signal,
    user2: Signal,
}

impl ForwardedSignals {
    fn install() -> io::Result<Self> {
        Ok(ForwardedSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            user1: signal(SignalKind::user_defined1())?,
            user2: signal(SignalKind::user_defined2())?,
        })
    }

    async fn recv(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
            _ = self.user1.recv() => libc::SIGUSR1,
            _ = self.user2.recv() => libc::SIGUSR2,
        }
    }
}
