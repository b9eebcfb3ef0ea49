//! `distlock cron`: [`distlock::cron::Scheduler`] with commands as jobs.
//!
//! Each run of a job's command goes through [`crate::supervise`], as for
//! `distlock run`: no shell, its own process group, a watchdog that kills
//! the group if distlock dies, stopped before its lock can lapse. Several
//! commands may run at once (one per job); the process's one reaper
//! ([`crate::reaper`]) hands each its own statuses. SIGINT and SIGTERM are
//! not forwarded: they start the graceful shutdown (no new ticks; running
//! commands get `--grace` to finish, then SIGTERM, then SIGKILL after
//! `--kill-after`). At start it prints the backend's
//! [durability warnings](distlock::Locker::durability_warnings) once (for
//! example a Redis without `appendonly yes`, which a restart would make
//! re-run finished ticks).

use std::ffi::OsString;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlock::cron::chrono::SecondsFormat;
use distlock::cron::{JobContext, Scheduler, TickOutcome, TickReport};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::CronArgs;
use crate::cron_config::{self, JobSpec};
use crate::exit;
use crate::supervise::{kill_after_cap, supervise, Command};

/// How long after `--kill-after` the scheduler still waits for a stopped
/// command's group before it gives up on it (the supervisor SIGKILLs it
/// well before that).
const STOP_SLACK: Duration = Duration::from_secs(5);

/// Runs the jobs until SIGINT or SIGTERM, then shuts down gracefully.
/// Returns 0 after a graceful shutdown, 64 for bad jobs (before anything
/// runs), 69 if the backend cannot be reached, 70 if distlock cannot set up.
pub(crate) async fn cron(args: CronArgs) -> u8 {
    let specs = match cron_config::jobs(&args) {
        Ok(specs) => specs,
        Err(error) => {
            eprintln!("distlock: {error}");
            return exit::USAGE;
        }
    };
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(interrupt), Ok(terminate)) => (interrupt, terminate),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("distlock: cannot install signal handlers: {error}");
            return exit::SOFTWARE;
        }
    };
    let locker = match crate::run::open(&args.backend).await {
        Ok(locker) => locker,
        Err(error) => return crate::run::fail(&error),
    };
    // What the backend found, when it connected, that a restart or a
    // failover would make it forget (a Redis without `appendonly yes`
    // forgets which ticks ran and resets fencing tokens): said once, here,
    // before the first tick, not per tick. Asking also keeps the library
    // from logging it again at the first mark write.
    for warning in locker.durability_warnings() {
        eprintln!("distlock: warning: {warning}");
    }
    let mut scheduler = Scheduler::new(locker)
        .on_tick(log_line)
        .stop_timeout(args.kill_after.saturating_add(STOP_SLACK));
    if let Some(id) = &args.replica_id {
        scheduler = scheduler.replica_id(id.clone());
    }
    let count = specs.len();
    for JobSpec { job, command } in specs {
        // What `distlock status` shows as the holder of the job's locks.
        let label = format!(
            "cron job {}: {}",
            job.name(),
            distlock::inspect::command_label(&command)
        );
        let job = job.label(label);
        let command: Arc<[OsString]> = command.into();
        let kill_after = args.kill_after;
        let added = scheduler.add(job, move |ctx: JobContext| {
            let command = command.clone();
            async move { run_command(&ctx, &command, kill_after).await }
        });
        if let Err(error) = added {
            eprintln!("distlock: {error}");
            return exit::USAGE;
        }
    }
    let running = match scheduler.start() {
        Ok(running) => running,
        Err(error) => return crate::run::fail(&error),
    };
    tracing::info!(jobs = count, "distlock cron: scheduled");
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!(
        "distlock: cron: shutting down; running commands get {} to finish",
        humantime::format_duration(args.grace)
    );
    running.shutdown(args.grace).await;
    0
}

/// One run of a job's command, under the run's lease.
async fn run_command(
    ctx: &JobContext,
    argv: &[OsString],
    kill_after: Duration,
) -> distlock::cron::JobResult {
    let lease = ctx.lease();
    let command = Command {
        argv,
        env: vec![
            ("DISTLOCK_JOB", ctx.job().to_owned()),
            (
                "DISTLOCK_SCHEDULED_AT",
                ctx.scheduled_at()
                    .to_rfc3339_opts(SecondsFormat::AutoSi, true),
            ),
            ("DISTLOCK_TICK_KEY", ctx.tick_key().to_owned()),
            ("DISTLOCK_REPLICA", ctx.replica().to_owned()),
        ],
        kill_after: kill_after.min(kill_after_cap(lease.ttl())),
        interactive: false,
    };
    match supervise(&command, lease, ctx.stop_requested()).await {
        0 => Ok(()),
        code => Err(Box::new(CommandFailed(code))),
    }
}

/// A run whose command exited non-zero (or could not run).
#[derive(Debug)]
struct CommandFailed(u8);

impl fmt::Display for CommandFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            exit::NOT_FOUND => write!(f, "exit code {} (command not found)", self.0),
            exit::CANNOT_EXECUTE => write!(f, "exit code {} (cannot execute)", self.0),
            code if code > 128 => write!(f, "exit code {code} (killed by signal {})", code - 128),
            code => write!(f, "exit code {code}"),
        }
    }
}

impl std::error::Error for CommandFailed {}

/// The one line per tick per replica on stderr.
fn log_line(report: &TickReport) {
    let at = report
        .scheduled_at
        .to_rfc3339_opts(SecondsFormat::AutoSi, true);
    let what = match &report.outcome {
        TickOutcome::Ran {
            lag,
            duration,
            result: Ok(()),
        } => format!(
            "ran: exit code 0 in {}ms (lag {}ms)",
            duration.as_millis(),
            lag.as_millis()
        ),
        outcome => outcome.to_string(),
    };
    let catch_up = if report.catch_up { " (catch-up)" } else { "" };
    eprintln!(
        "distlock: cron job {:?} tick {at}{catch_up} on {}: {what}",
        report.job, report.replica
    );
}
